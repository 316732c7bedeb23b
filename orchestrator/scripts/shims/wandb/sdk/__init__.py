"""``wandb.sdk``: only what frameworks import from it (runyard's stand-in; see ``wandb/__init__.py``)."""
