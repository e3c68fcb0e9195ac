// Run by e2e/idempotency_test.go (TestSDKRetriesAreChargedOnce), not by
// `node --test`: one call with each official SDK, each carrying an
// Idempotency-Key the SDK keeps across its own retries. The test resets
// the client's connection while each call runs upstream, so each SDK
// retries (connection errors are retried by default); the gateway must
// answer the retry from the first run. Exit code 0 when both calls got
// their answer; one JSON line per call on stdout.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const need = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: e2e/idempotency_test.go runs this file`);
  return v;
};
const baseURL = need('GATEWAY_URL').replace(/\/+$/, '');
const apiKey = need('WALLET_KEY');
const common = { apiKey, maxRetries: 2, timeout: 20000 };

// The OpenAI client sends an Idempotency-Key only when its class names
// the header: then every call gets one (stainless-node-retry-<uuid>),
// reused by the call's retries. docs/errors.md shows this subclass.
class IdempotentOpenAI extends OpenAI {
  idempotencyHeader = 'Idempotency-Key';
}
const openai = new IdempotentOpenAI({ ...common, baseURL: baseURL + '/v1' });
const chat = await openai.chat.completions.create(
  { model: 'gpt-idem', messages: [{ role: 'user', content: 'Say hello.' }] },
).withResponse();
console.log(JSON.stringify({ sdk: 'openai', text: chat.data.choices[0].message.content,
  replayed: chat.response.headers.get('idempotent-replayed') }));

const anthropic = new Anthropic({ ...common, baseURL });
const msg = await anthropic.messages.create(
  { model: 'claude-idem', max_tokens: 64, messages: [{ role: 'user', content: 'Say hello.' }] },
  { headers: { 'Idempotency-Key': `anthropic-${process.pid}` } },
).withResponse();
console.log(JSON.stringify({ sdk: 'anthropic', text: msg.data.content[0].text,
  replayed: msg.response.headers.get('idempotent-replayed') }));
