"""Helpers shared by more than one test suite (one copy of each piece of logic).

Import style: ``from support.<module> import name``. ``tests/conftest.py`` puts ``tests/`` on
``sys.path`` (whatever pytest's import mode), the same way the suites import their own helper modules
(``procs``, ``broker_helpers``, ``store_helpers``, ...).

| module     | what                                                                          |
|------------|-------------------------------------------------------------------------------|
| ``aio``    | ``wait_for``: poll a sync or async condition on the running event loop          |
| ``ports``  | loopback free-port finding and probing                                          |
| ``inproc`` | in-process NameServer + BrokerController fixtures (``namesrv``, ``broker``)     |
| ``jsonl``  | reading JSON-lines files written by helper subprocesses                         |
"""
