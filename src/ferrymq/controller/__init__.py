"""Controller mode: a Raft-replicated controller that elects the master of every broker group
(RocketMQ 5 style). ``state`` is the pure state machine, ``raft`` the only module that imports pysyncobj,
``processors`` the remoting requests, ``app`` the running controller. See docs/controller.md."""
