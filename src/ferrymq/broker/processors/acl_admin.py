"""ACL management codes 50..54 (layouts in acl/edit.py): change and read this broker's ``plain_acl.yml``.

They are admin-only (the ACL check in front of them wants a signed admin account). A broker without aclEnable
answers SYSTEM_ERROR naming the key; a change that would leave the file invalid is refused with the reason and
the file is left as it was. A change is in force for the next request (the file is re-read at once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ferrymq.acl import edit
from ferrymq.errors import ConfigError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import AclAdminContext

ACL_OFF_REMARK = "aclEnable is false on this broker: there is no ACL to manage"


class AclAdminProcessor:
    def __init__(self, ctx: AclAdminContext) -> None:
        self.ctx = ctx

    def register(self, d: Any) -> None:
        C = RequestCode
        for code, fn in ((C.UPDATE_AND_CREATE_ACL_CONFIG, self.update_account),
                         (C.DELETE_ACL_CONFIG, self.delete_account),
                         (C.GET_BROKER_CLUSTER_ACL_INFO, self.acl_info),
                         (C.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, self.update_white_addrs),
                         (C.GET_BROKER_CLUSTER_ACL_CONFIG, self.acl_config)):
            d.register(code, fn)

    @property
    def _path(self) -> str | None:
        return self.ctx.config.acl_path if self.ctx.config.acl_enable else None

    def _change(self, cmd: RemotingCommand, change: Any) -> RemotingCommand:
        path = self._path
        if path is None:
            return cmd.response(R.SYSTEM_ERROR, remark=ACL_OFF_REMARK)
        try:
            doc = change(edit.load_doc(path))
            edit.save_doc(path, doc)
        except (ValueError, ConfigError) as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=f"ACL not changed: {exc}")
        except OSError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=f"ACL not changed: cannot write {path}: {exc.strerror}")
        guard = self.ctx.acl_guard
        if guard is not None:
            guard.reload_now()
        return cmd.response(R.SUCCESS)

    def update_account(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        return self._change(cmd, lambda doc: edit.upsert_account(doc, cmd.ext_fields))

    def delete_account(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        access_key = cmd.ext_fields.get("accessKey", "").strip()
        return self._change(cmd, lambda doc: edit.delete_account(doc, access_key))

    def update_white_addrs(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        addresses = cmd.ext_fields.get("globalWhiteAddrs", "")
        return self._change(cmd, lambda doc: edit.set_global_white(doc, addresses))

    def _doc(self, cmd: RemotingCommand) -> tuple[dict[str, Any] | None, RemotingCommand | None]:
        path = self._path
        if path is None:
            return None, cmd.response(R.SYSTEM_ERROR, remark=ACL_OFF_REMARK)
        try:
            return edit.load_doc(path), None
        except ConfigError as exc:
            return None, cmd.response(R.SYSTEM_ERROR, remark=str(exc))

    def acl_info(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        doc, error = self._doc(cmd)
        if doc is None:
            assert error is not None
            return error
        cfg = self.ctx.config
        return cmd.response(R.SUCCESS, {
            "version": jsonx.dumps(edit.data_version(doc)).decode(), "brokerName": cfg.broker_name,
            "brokerAddr": self.ctx.broker_addr, "clusterName": cfg.broker_cluster_name})

    def acl_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        doc, error = self._doc(cmd)
        if doc is None:
            assert error is not None
            return error
        return cmd.response(R.SUCCESS, body=jsonx.dumps(edit.to_wire(doc)))
