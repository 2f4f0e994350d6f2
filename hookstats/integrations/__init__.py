"""Callbacks for training frameworks: fastai.py, lightning.py, hf.py. Each imports its framework, so
`import hookstats` never imports this package; import the one you use (an optional extra each)."""
