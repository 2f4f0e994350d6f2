"""The tools around the engine: the command line (cli, args), the demo, the planner (planner, op_speed,
presets), charts (plots), the summary table, progress bars and the `bench` command. The engine never imports
this package (tests/test_architecture.py)."""
