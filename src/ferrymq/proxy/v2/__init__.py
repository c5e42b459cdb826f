"""Generated protobuf and gRPC modules of ``apache.rocketmq.v2`` (the RocketMQ 5 client protocol).

Do not edit the ``*_pb2*.py`` / ``*_pb2.pyi`` files: they are generated from ``proto/`` (see README.md
beside this file for the proto version and the command that regenerates them).
"""
