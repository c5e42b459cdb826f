"""The gRPC endpoint: a ``grpc.aio`` server carrying ``MessagingService``.

One implementation, two ways to run it: ``ferry proxy -n NAMESRV --listen HOST:PORT`` (cluster mode, in
front of every broker group the name servers know), or inside the broker process when the broker config
says ``enableGrpcServer=true`` (local mode, ``grpcServerPort``; the proxy uses the broker's name servers).
"""

from __future__ import annotations

import logging

import grpc
from ferrymq.client.config import local_ip
from ferrymq.proxy.config import ProxyConfig
from ferrymq.proxy.service import MessagingService
from ferrymq.proxy.v2 import service_pb2_grpc as sgrpc

log = logging.getLogger(__name__)

#: gRPC message size limit both ways (a 4 MiB body plus its properties and framing)
MAX_GRPC_MESSAGE_BYTES = 16 * 1024 * 1024
#: how long stop() lets running calls finish
STOP_GRACE_S = 1.0


class ProxyServer:
    def __init__(self, config: ProxyConfig) -> None:
        config.validate()
        self.config = config
        self.service = MessagingService(config)
        self._server: grpc.aio.Server | None = None
        self.port = config.listen_port

    @property
    def addr(self) -> str:
        return f"{self.service.advertised_host}:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ])
        sgrpc.add_MessagingServiceServicer_to_server(self.service, server)
        try:
            bound = server.add_insecure_port(f"{self.config.listen_host}:{self.config.listen_port}")
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise OSError(f"cannot listen on {self.config.listen_host}:{self.config.listen_port}")
        self.port = bound
        host = self.config.listen_host
        self.service.advertised_host = local_ip() if host in ("0.0.0.0", "::", "") else host
        self.service.advertised_port = bound
        await self.service.start()
        await server.start()
        self._server = server
        log.info("gRPC proxy (apache.rocketmq.v2) serving on %s:%d", host, bound)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(STOP_GRACE_S)
            self._server = None
        await self.service.close()
