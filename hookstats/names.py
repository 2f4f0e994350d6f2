"""How a target name is shown in tables and charts: at most WIDTH characters, a longer one cut in the middle
with an ellipsis (its start and its end, the kind, stay), so what a name costs to draw or print is bounded."""
WIDTH = 60


def short(name, width=WIDTH):
    name = str(name)
    if len(name) <= width:
        return name
    head = (width - 1) * 2 // 3
    return name[:head] + "\u2026" + name[len(name) - (width - 1 - head):]
