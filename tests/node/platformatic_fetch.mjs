// Produces COUNT messages to a new topic of two partitions with @platformatic/kafka, consumes
// them back with a group consumer, and prints one JSON line: {"consumed": [values]}. Its 1.x
// versions fetch only by topic id (Fetch v13+, KIP-516): their v12 writes the topic id where
// the name goes. Usage:
//   node platformatic_fetch.mjs BOOTSTRAP TOPIC COUNT
import { Admin, Consumer, Producer, stringDeserializers, stringSerializers } from '@platformatic/kafka'

const [bootstrap, topic, countText] = process.argv.slice(2)
const count = Number(countText)
const bootstrapBrokers = [bootstrap]

const admin = new Admin({ clientId: 'pk-admin', bootstrapBrokers })
await admin.createTopics({ topics: [topic], partitions: 2, replicas: 1 })
await admin.close()

const producer = new Producer({ clientId: 'pk-producer', bootstrapBrokers, serializers: stringSerializers })
const messages = []
for (let i = 0; i < count; i++) messages.push({ topic, key: `k${i}`, value: `v${i}`, partition: i % 2 })
await producer.send({ messages })
await producer.close()

const consumer = new Consumer({
  groupId: `pk-${topic}`, clientId: 'pk-consumer', bootstrapBrokers,
  deserializers: stringDeserializers, maxWaitTime: 100
})
const stream = await consumer.consume({ topics: [topic], mode: 'earliest', autocommit: false })
const consumed = []
const timer = setTimeout(() => { console.log(JSON.stringify({ consumed, timeout: true })); process.exit(2) }, 60000)
for await (const message of stream) {
  consumed.push(message.value)
  if (consumed.length >= count) break
}
clearTimeout(timer)
await stream.close()
await consumer.close()
console.log(JSON.stringify({ consumed }))
