// Publish with confirms, consume with acks, and check a mandatory return, through amqplib.
const amqp = require('amqplib');

async function main() {
  const url = process.argv[2];
  const conn = await amqp.connect(url);
  const ch = await conn.createConfirmChannel();
  const q = await ch.assertQueue('', { exclusive: true });
  for (let i = 0; i < 10; i++) {
    ch.sendToQueue(q.queue, Buffer.from(`m${i}`), { contentType: 'text/plain' });
  }
  await ch.waitForConfirms();
  let returned = null;
  ch.on('return', (msg) => { returned = msg.fields.replyCode; });
  await new Promise((resolve) => {
    ch.publish('amq.direct', 'nowhere', Buffer.from('x'), { mandatory: true }, () => resolve());
  });
  const got = [];
  await new Promise((resolve) => {
    ch.consume(q.queue, (msg) => {
      got.push(msg.content.toString());
      ch.ack(msg);
      if (got.length === 10) resolve();
    });
  });
  await conn.close();
  console.log(JSON.stringify({ got, returned }));
}

main().catch((err) => { console.error(err); process.exit(1); });
