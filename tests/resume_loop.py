"""The training loop both processes of the resume tests run, as source for a child process (and exec'd in the
test's own): model and optimizer from a seed, data from the step number and the process (so that two processes'
values of one step differ), the test's own hooks keeping every measured tensor in float64."""
import textwrap

LOOP = textwrap.dedent("""
    import torch
    from torch import nn

    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
        return model, torch.optim.SGD(model.parameters(), lr=0.05)

    def own_hooks(model, seen, clock):
        def fwd(name):
            def hook(m, i, o):
                seen.append((clock[0], name + ":output", o.detach().double().flatten()))
                o.register_hook(lambda g: seen.append((clock[0], name + ":grad_output", g.double().flatten())))
            return hook
        for name in ("0", "2"):
            model.get_submodule(name).register_forward_hook(fwd(name))

    def train(model, opt, steps, clock, process=0):
        for s in steps:
            clock[0] = s
            g = torch.Generator().manual_seed(100 + s + 1000 * process)
            model(torch.randn(7, 5, generator=g) * (1 + s % 3)).square().mean().backward()
            opt.step()
            opt.zero_grad()
""")
