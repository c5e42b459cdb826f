'use strict';
// Sends with the npm ali-ons producer until killed, one JSON line per outcome to args.out:
//   {seq, ok, body, msgId, startMs, endMs[, error]}
// Run by tests/acceptance/test_failover_controller.py with one JSON argument: {namesrv, topic, producerGroup,
// prefix, out, logDir}. Bodies: `${prefix}-body-${seq}`.

const path = require('path');
const fs = require('fs');
const httpclient = require('urllib');
const { Producer, Message } = require('ali-ons');

const args = JSON.parse(process.argv[2] || '{}');
const logDir = args.logDir || process.cwd();
const logFile = fs.createWriteStream(path.join(logDir, 'alions-loop.log'), { flags: 'a' });
const out = fs.openSync(args.out, 'a');

function note(level, parts) {
  logFile.write(`${new Date().toISOString()} ${level} ${parts.map(p => (p instanceof Error ? p.stack : String(p))).join(' ')}\n`);
}
const logger = { info: (...a) => note('INFO', a), warn: (...a) => note('WARN', a), error: (...a) => note('ERROR', a), debug: () => {} };

function record(obj) {
  fs.writeSync(out, JSON.stringify(obj) + '\n');
}

async function main() {
  const producer = new Producer({ httpclient, nameSrv: args.namesrv, logger, accessKeyId: '', accessKeySecret: '',
    producerGroup: args.producerGroup });
  await producer.ready();
  for (let seq = 0; ; seq++) {
    const body = `${args.prefix}-body-${seq}`;
    const startMs = Date.now();
    try {
      const res = await producer.send(new Message(args.topic, 'TagA', Buffer.from(body)));
      record({ seq, ok: res.sendStatus === 'SEND_OK', status: res.sendStatus, body, msgId: res.msgId, startMs, endMs: Date.now() });
    } catch (err) {
      record({ seq, ok: false, body, error: String(err && err.message || err), startMs, endMs: Date.now() });
      await new Promise(r => setTimeout(r, 50));
    }
  }
}

main().catch(err => { note('ERROR', [err]); process.exit(1); });
