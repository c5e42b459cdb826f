"""Plain ACL (RocketMQ 4.x ``plain_acl.yml``): accounts, permissions, address whitelists, and the check
every request passes before its handler when ``aclEnable=true`` (docs/security.md)."""
