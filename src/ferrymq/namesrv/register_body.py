"""REGISTER_BROKER body codec: the name server uses the shared one in ``ferrymq.common.register_body_codec``
(field tables and API there); this module keeps the name server's historical import path."""

from __future__ import annotations

from ferrymq.common.register_body_codec import (
    CRC32_MASK,
    MAX_INFLATED_BODY_BYTES,
    MAX_TOPICS_PER_REGISTRATION,
    CompressedRegisterBodyReader,
    RegisterBrokerBody,
    body_crc32,
    decode_compressed_register_body,
    decode_register_body,
    encode_compressed_register_body,
    encode_register_body,
)

__all__ = [
    "CRC32_MASK",
    "MAX_INFLATED_BODY_BYTES",
    "MAX_TOPICS_PER_REGISTRATION",
    "CompressedRegisterBodyReader",
    "RegisterBrokerBody",
    "body_crc32",
    "decode_compressed_register_body",
    "decode_register_body",
    "encode_compressed_register_body",
    "encode_register_body",
]
