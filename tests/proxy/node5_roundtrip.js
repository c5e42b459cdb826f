'use strict';
// Drives the npm 5.x client (rocketmq-client-nodejs, gRPC) against ferrymq's gRPC endpoint: send `count`
// messages, then receive and ack them with a SimpleConsumer. Run by tests/proxy/test_grpc_interop.py with
// one JSON argument:
//   {moduleDir, endpoints, topic, group, count, prefix, timeoutMs, accessKey?, accessSecret?}
// (moduleDir: the node_modules folder the test installed the client into). Prints one JSON summary line on
// stdout: {sent: [{seq, messageId}], sendErrors, received: [{body, tag, keys, props, messageId, attempt}],
// met, errors}.

const path = require('path');
const fs = require('fs');

const args = JSON.parse(process.argv[2] || '{}');
const { Producer, SimpleConsumer } = require(path.join(args.moduleDir, 'rocketmq-client-nodejs'));
const errors = [];
const logger = {
  info: () => {}, debug: () => {}, trace: () => {},
  warn: (...a) => errors.push(`warn: ${a.map(String).join(' ')}`),
  error: (...a) => errors.push(`error: ${a.map(String).join(' ')}`),
};

async function main() {
  const deadline = Date.now() + (args.timeoutMs || 60000);
  const common = { endpoints: args.endpoints, logger, requestTimeout: 5000 };
  if (args.accessKey) common.sessionCredentials = { accessKey: args.accessKey, accessSecret: args.accessSecret };
  const result = { sent: [], sendErrors: [], received: [], met: false, errors };

  const producer = new Producer(Object.assign({ topics: [args.topic] }, common));
  await producer.startup();
  for (let seq = 0; seq < args.count; seq++) {
    try {
      const receipt = await producer.send({
        topic: args.topic, tag: 'TagN', keys: [`${args.prefix}-key-${seq}`],
        properties: new Map([['seq', String(seq)]]), body: Buffer.from(`${args.prefix}-${seq}`),
      });
      result.sent.push({ seq, messageId: receipt.messageId });
    } catch (err) {
      result.sendErrors.push({ seq, error: String(err && err.message || err) });
    }
  }
  await producer.shutdown();

  const consumer = new SimpleConsumer(Object.assign({
    consumerGroup: args.group, subscriptions: new Map([[args.topic, '*']]), awaitDuration: 2000,
  }, common));
  await consumer.startup();
  const seen = new Set();
  while (seen.size < result.sent.length && Date.now() < deadline) {
    let messages = [];
    try {
      messages = await consumer.receive(16, 15000);
    } catch (err) {
      errors.push(`receive: ${err && err.message || err}`);
      continue;
    }
    for (const m of messages) {
      result.received.push({
        body: m.body.toString(), tag: m.tag, keys: m.keys, props: Object.fromEntries(m.properties),
        messageId: m.messageId, attempt: m.deliveryAttempt,
      });
      seen.add(m.body.toString());
      await consumer.ack(m);
    }
  }
  result.met = seen.size === result.sent.length && result.sent.length === args.count;
  await consumer.shutdown();
  fs.writeSync(1, JSON.stringify(result) + '\n');
}

main().then(
  () => process.exit(0),
  err => {
    fs.writeSync(1, JSON.stringify({ fatal: String(err && err.stack || err), errors }) + '\n');
    process.exit(1);
  },
);
