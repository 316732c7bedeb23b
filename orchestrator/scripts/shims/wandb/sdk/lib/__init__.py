"""``wandb.sdk.lib``: the names frameworks check a run against (Lightning's ``WandbLogger`` tests
``isinstance(run, (Run, RunDisabled))`` before it declares its step metric)."""


class RunDisabled:
    """wandb's run object under ``mode="disabled"``; the stand-in never returns one."""
