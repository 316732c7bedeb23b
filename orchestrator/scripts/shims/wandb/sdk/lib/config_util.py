"""``wandb.sdk.lib.config_util``: the error Hugging Face's ``WandbCallback`` catches around a config
change (runyard's stand-in never raises it)."""


class ConfigError(Exception):
    """wandb's refusal of a config change."""
