"""Send messages with the Apache C++ client (PyPI rocketmq==0.4.4). argv[1] JSON: namesrv, topic, count.
Prints one JSON line per send: {"seq", "msg_id", "status"}. Bodies are NUL-free (0.4.4 cuts at NUL)."""

import json
import os
import sys

from rocketmq.client import Message, Producer


def main() -> None:
    a = json.loads(sys.argv[1])
    producer = Producer("cpp-interop-pg")
    producer.set_namesrv_addr(a["namesrv"])
    producer.start()
    for seq in range(int(a["count"])):
        msg = Message(a["topic"])
        msg.set_keys(f"cppkey-{seq}")
        msg.set_tags("CppTag")
        msg.set_property("myprop", f"v{seq}")
        msg.set_body(f"cpp-body-{seq}")
        res = producer.send_sync(msg)
        print(json.dumps({"seq": seq, "msg_id": res.msg_id, "status": int(res.status)}), flush=True)
    producer.shutdown()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
