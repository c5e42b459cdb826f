'use strict';
// Drives the npm ali-ons client against ferrymq: produce N messages, then consume them with a push
// consumer (clustering). Run by tests/acceptance/test_alions.py with one JSON argument:
//   {namesrv, topic, producerGroup, consumerGroup, count, prefix, expression, timeoutMs, logDir,
//    accessKeyId?, accessKeySecret?} (ACL credentials: ali-ons then signs every request)
// Prints one JSON summary line on stdout: {sent:[{seq, msgId, status, queueId}], sendErrors:[...],
// received:[{seq, body, tags, keys, prop, msgId, queueId, queueOffset}], met, errors:[...]}.
// Bodies/keys/tags follow the same pattern as the C++ scripts (see cpp_scripts/_cpp_common.py).

const path = require('path');
const fs = require('fs');
const httpclient = require('urllib');
const { Producer, Consumer, Message } = require('ali-ons');

const args = JSON.parse(process.argv[2] || '{}');
const TAGS = ['TagA', 'TagB'];
const logDir = args.logDir || process.cwd();
const logFile = fs.createWriteStream(path.join(logDir, 'alions.log'), { flags: 'a' });
const errors = [];

function note(level, parts) {
  logFile.write(`${new Date().toISOString()} ${level} ${parts.map(p => (p instanceof Error ? p.stack : typeof p === 'string' ? p : JSON.stringify(p))).join(' ')}\n`);
}
// ali-ons logs a lot; keep it in a file so stdout stays one JSON line
const logger = {
  info: (...a) => note('INFO', a),
  warn: (...a) => note('WARN', a),
  error: (...a) => { note('ERROR', a); errors.push(String(a[0] && a[0].message || a[0])); },
  debug: () => {},
};

function expected(seq) {
  return {
    seq,
    body: `${args.prefix}-body-${seq}-`,
    keys: `${args.prefix}-key-${seq}`,
    tags: TAGS[seq % TAGS.length],
    prop: `${args.prefix}-v-${seq}`,
  };
}

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`timeout: ${what} after ${ms} ms`)), ms); }),
  ]).finally(() => clearTimeout(timer));
}

async function main() {
  const deadline = Date.now() + (args.timeoutMs || 120000);
  const common = { httpclient, nameSrv: args.namesrv, logger, accessKeyId: args.accessKeyId || '',
    accessKeySecret: args.accessKeySecret || '' };
  const result = { sent: [], sendErrors: [], received: [], met: false, errors };

  const producer = new Producer(Object.assign({ producerGroup: args.producerGroup }, common));
  await withTimeout(producer.ready(), 30000, 'producer ready');
  for (let seq = 0; seq < args.count; seq++) {
    const exp = expected(seq);
    const msg = new Message(args.topic, exp.tags, Buffer.from(exp.body));
    msg.keys = [exp.keys];
    msg.properties.seq = String(seq);
    msg.properties.myprop = exp.prop;
    try {
      const r = await withTimeout(producer.send(msg), 10000, `send ${seq}`);
      result.sent.push({ seq, msgId: r.msgId, status: r.sendStatus, queueId: r.messageQueue && r.messageQueue.queueId });
    } catch (err) {
      result.sendErrors.push({ seq, error: String(err && err.message || err) });
      note('ERROR', ['send', seq, err]);
    }
    if (Date.now() > deadline) break;
  }
  await withTimeout(producer.close(), 10000, 'producer close').catch(e => errors.push(String(e.message)));

  const want = new Set(result.sent.map(s => s.seq));
  const seen = new Set();
  const consumer = new Consumer(Object.assign({
    consumerGroup: args.consumerGroup,
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
    isBroadcast: false,
  }, common));
  consumer.on('error', err => { note('ERROR', ['consumer', err]); errors.push(String(err && err.message || err)); });
  let resolveDone;
  const done = new Promise(resolve => { resolveDone = resolve; });
  consumer.subscribe(args.topic, args.expression || '*', async msg => {
    const seq = Number(msg.properties.seq);
    result.received.push({
      seq,
      body: msg.body.toString(),
      tags: msg.tags,
      keys: msg.keys,
      prop: msg.properties.myprop,
      msgId: msg.msgId,
      queueId: msg.queueId,
      queueOffset: Number(msg.queueOffset),
    });
    seen.add(seq);
    if (want.size > 0 && [...want].every(s => seen.has(s))) resolveDone();
  });
  if (want.size === 0) resolveDone();
  try {
    await withTimeout(consumer.ready(), 30000, 'consumer ready');
    await withTimeout(done, Math.max(1000, deadline - Date.now()), 'all messages consumed');
    result.met = true;
  } catch (err) {
    errors.push(String(err && err.message || err));
  }
  await withTimeout(consumer.close(), 15000, 'consumer close').catch(e => errors.push(String(e.message)));
  fs.writeSync(1, JSON.stringify(result) + '\n'); // synchronous: process.exit() must not cut it
}

main().then(
  () => { logFile.end(() => process.exit(0)); },
  err => {
    fs.writeSync(1, JSON.stringify({ fatal: String(err && err.stack || err), errors }) + '\n');
    logFile.end(() => process.exit(1));
  },
);
