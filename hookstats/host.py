"""Host reads of the running states: one packed device-to-host copy per device, when a readout asks."""
import torch

from .buffers import order


def to_host(states):
    """{id(state): (fstate, istate)} as NumPy rows: one packed device-to-host transfer per device."""
    order(states)
    by_dev = {}
    for st in states:
        by_dev.setdefault(st.fstate.device, []).append(st)
    host = {}
    for sts in by_dev.values():
        f = torch.cat([s.total_fstate() for s in sts]).cpu().numpy().reshape(len(sts), -1)
        i = torch.cat([s.istate for s in sts]).cpu().numpy().reshape(len(sts), -1)
        for k, s in enumerate(sts):
            host[id(s)] = (f[k], i[k])
    return host
