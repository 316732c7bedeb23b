"""What runs in torchrun's agent, not in the ranks: torchrun with every socket on loopback
(``python -m trainer.agent.torchrun``, torchrun.py) and the warm start of the ranks (warm.py)."""
