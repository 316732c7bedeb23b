"""Built-in workloads. Each exposes ``train(config, dist_info, reporter, stop) -> dict``."""
