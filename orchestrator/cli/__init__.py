"""The ``runyard`` command: the group in ``group``, its verbs by group in the other modules.

Nothing is imported here, so that ``runyard --help`` loads only the group and each verb loads
its own module when it runs.
"""
