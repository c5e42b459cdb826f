"""gRPC endpoint for RocketMQ 5 clients (``apache.rocketmq.v2.MessagingService``), translated onto the 4.x
remoting protocol through ferrymq's own client. See docs/grpc.md."""
