'use strict';
// Consumes with the npm ali-ons (4.x remoting) client what a 5.x SDK producer sent through the gRPC endpoint.
// Run by tests/proxy/test_grpc_interop.py with one JSON argument:
//   {namesrv, topic, consumerGroup, expect, expression, timeoutMs, logDir}
// ali-ons comes from tests/acceptance/node/node_modules (that folder's package.json installs it).
// Prints one JSON summary line on stdout: {received: [{body, tags, keys, props, msgId}], met, errors}.

const path = require('path');
const fs = require('fs');

const nodeDir = path.join(__dirname, '..', 'acceptance', 'node', 'node_modules');
const httpclient = require(path.join(nodeDir, 'urllib'));
const { Consumer } = require(path.join(nodeDir, 'ali-ons'));

const args = JSON.parse(process.argv[2] || '{}');
const logFile = fs.createWriteStream(path.join(args.logDir || process.cwd(), 'alions-consume.log'), { flags: 'a' });
const errors = [];

function note(level, parts) {
  logFile.write(`${new Date().toISOString()} ${level} ${parts.map(p => (p instanceof Error ? p.stack : typeof p === 'string' ? p : JSON.stringify(p))).join(' ')}\n`);
}
const logger = {
  info: (...a) => note('INFO', a),
  warn: (...a) => note('WARN', a),
  error: (...a) => { note('ERROR', a); errors.push(String(a[0] && a[0].message || a[0])); },
  debug: () => {},
};

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`timeout: ${what} after ${ms} ms`)), ms); }),
  ]).finally(() => clearTimeout(timer));
}

async function main() {
  const deadline = Date.now() + (args.timeoutMs || 60000);
  const result = { received: [], met: false, errors };
  const consumer = new Consumer({
    httpclient, nameSrv: args.namesrv, logger, consumerGroup: args.consumerGroup,
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET', isBroadcast: false,
  });
  consumer.on('error', err => { note('ERROR', ['consumer', err]); errors.push(String(err && err.message || err)); });
  let resolveDone;
  const done = new Promise(resolve => { resolveDone = resolve; });
  consumer.subscribe(args.topic, args.expression || '*', async msg => {
    const props = Object.assign({}, msg.properties);
    result.received.push({ body: msg.body.toString(), tags: msg.tags, keys: msg.keys, props, msgId: msg.msgId });
    if (result.received.length >= args.expect) resolveDone();
  });
  try {
    await withTimeout(consumer.ready(), 30000, 'consumer ready');
    await withTimeout(done, Math.max(1000, deadline - Date.now()), 'all messages consumed');
    result.met = true;
  } catch (err) {
    errors.push(String(err && err.message || err));
  }
  await withTimeout(consumer.close(), 15000, 'consumer close').catch(e => errors.push(String(e.message)));
  fs.writeSync(1, JSON.stringify(result) + '\n');
}

main().then(
  () => { logFile.end(() => process.exit(0)); },
  err => {
    fs.writeSync(1, JSON.stringify({ fatal: String(err && err.stack || err), errors }) + '\n');
    logFile.end(() => process.exit(1));
  },
);
