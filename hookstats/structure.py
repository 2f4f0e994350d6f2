"""The model changed after attach: modules that attach()'s selection would pick now but that carry no hook (PEFT's
LoRA layers, a new head), hooked modules no longer in the model, and parameters that param_grads/params would measure
whose objects are not the hooked ones (weight_norm, module.weight = nn.Parameter(...), load_state_dict(assign=True)). Checked at rare
points (the first step's end, every log window, stats()), never in a hook; said once."""

SHOWN = 4  # names a warning spells out


class StructureCheck:
    """What attach() hooked, by object identity (the monitor holds those objects, so their ids stay theirs): a
    wrapper around the root (torch.compile, DDP, an EMA's deepcopy) or around a hooked module (activation
    checkpointing's CheckpointWrapper) moves no hooked object and adds none that the rules pick."""

    def __init__(self, adapter, options, modules, param_hooks, tell, every=10):
        self.adapter, self.options, self.tell, self.every = adapter, options, tell, every
        self.modules = {id(m): name for name, m in modules.items()}
        # (what the hook measures, which parameters it takes, the ids it holds)
        checked = adapter.submodules() is not None  # a framework without the check holds its parameters otherwise
        self.param_hooks = [(what, hook.takes, set(hook.params)) for what, hook in param_hooks] if checked else []
        self.steps = 0
        self.told = False
        self.seen = self.fingerprint()
        self.attached_params = {i for i, _ in self.seen[1]} if self.seen else set()  # frozen ones too

    def on_step_end(self, clock, finished, sampled, hist, evaluated):
        self.steps += 1
        if self.steps == 1 or self.steps % self.every == 0:
            self.check()

    def check(self):
        if self.told:
            return
        now = self.fingerprint()
        if now == self.seen:  # the fast path: the same module and parameter objects as last time
            return
        found = self.changes()
        self.seen = now
        if found:
            self.told = True
            self.tell("structure", said(found))

    def fingerprint(self):
        """The ids of every module (and with param_grads/params, every parameter and whether it is trainable) in the
        model's order: one walk, a fifth of changes()' time. Another fingerprint is not yet a change (a wrapper was added): changes() decides."""
        modules = self.adapter.submodules()
        if modules is None:
            return None
        modules = list(modules)
        trainable = self.adapter.trainable  # a parameter unfrozen since attach has no gradient hook
        params = [(id(p), trainable(p)) for m in modules for _, p in self.adapter.own_params(m)] \
            if self.param_hooks else []
        return [id(m) for m in modules], params

    def changes(self):
        """[(what, names)]: what changed since attach, each with the names of what it concerns."""
        adapter = self.adapter
        present = adapter.submodules()
        if present is None:
            return []
        present = {id(m) for m in present}
        try:
            picked = adapter.select(self.options)
        except ValueError:  # the rules match nothing now: the hooked modules moved or went
            picked = {}
        hooked_names = set(self.modules.values())
        new = [f"{name} (replaced)" if name in hooked_names else name for name, m in picked.items()
               if id(m) not in self.modules and not adapter.passive(m)]
        gone = [name for i, name in self.modules.items() if i not in present]
        found = []
        if new:
            found.append(("modules that attach() would hook now carry no hook", new))
        gone = [name for name in gone if f"{name} (replaced)" not in new]
        if gone:
            found.append(("hooked modules are no longer in the model", gone))
        for what, take, held in self.param_hooks:
            missed = {}  # id -> name: a parametrized module and its ParametrizationList name one parameter twice
            for name, m in picked.items():
                for pn, p in adapter.measured_params(m):
                    if take(p) and id(p) not in held:
                        missed.setdefault(id(p), f"{name}.{pn}")
            unfrozen = [n for i, n in missed.items() if i in self.attached_params]  # the same object, frozen then
            missed = [n for i, n in missed.items() if i not in self.attached_params]
            if missed:
                found.append((f"parameters that {what}=True would measure carry no hook", missed))
            if unfrozen:
                found.append((f"parameters frozen at attach and unfrozen since carry no {what} hook", unfrozen))
        return found


def said(found):
    parts = "; ".join(f"{len(names)} {what} ({', '.join(names[:SHOWN])}{', ...' if len(names) > SHOWN else ''})"
                      for what, names in found)
    return (f"hookstats: the model changed after attach: {parts}. They are not measured. Attach after changing the "
            "model (get_peft_model, a new head, weight_norm or another parametrization, "
            "load_state_dict(assign=True)) and after unfreezing parameters, or call mon.remove() and attach again.")
