// The official `@anthropic-ai/sdk` against a running caddy-llm-failover gateway.
//
// Contract with whoever starts the gateway (a Go test, see README.md):
//   GATEWAY_URL     base URL of the gateway, e.g. http://127.0.0.1:9080; the
//                   SDK appends "/v1/messages" itself.
//   claude-failover messages; channel 1 streams message_start, ping, then
//                   `event: error` overloaded_error (and answers 529 to
//                   non-streaming requests); channel 2 serves normally with
//                   text containing "backup".
//   claude-down     messages; every channel answers 503: the gateway answers
//                   503 with an Anthropic-shaped body
//                   {"type":"error","error":{"type":...,"message":...}}.
//   claude-cut      messages; the stream commits (some text reaches the
//                   client), then the upstream cuts the connection: the
//                   gateway must end the stream with `event: error`.
//   claude-resume   messages with stream_resume continue; channel 1 streams
//                   text deltas " t00".." t59" and cuts after the 40th,
//                   channel 2 streams " t40".." t59": the SDK must see one
//                   message with the whole text.
//   claude-resume-46  the same cut, continued by a model that refuses a
//                   prefill (Claude 4.6 and later) and, asked in words,
//                   repeats the delivered tail first: the SDK must still see
//                   one message with the whole text, exactly.
// Clients use apiKey "sk-client-test"; the gateway must not forward it.
//
// maxRetries is 0 everywhere so the SDK's own retries cannot hide (or
// multiply) what the gateway did, except where a test checks the retries.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic, { APIError } from '@anthropic-ai/sdk';

const GATEWAY_URL = process.env.GATEWAY_URL;
if (!GATEWAY_URL) {
  throw new Error('GATEWAY_URL is not set: these tests need a running gateway (see README.md)');
}

// Shorter than the per-test timeout so a hung gateway fails as an SDK error
// with a message, not as an anonymous test timeout.
const client = new Anthropic({
  apiKey: 'sk-client-test',
  baseURL: GATEWAY_URL.replace(/\/+$/, ''),
  maxRetries: 0,
  timeout: 15000,
});

const T = { timeout: 20000 };
const params = { max_tokens: 64, messages: [{ role: 'user', content: 'Say hello.' }] };

// Drains a raw event stream, keeping what arrived before any error so tests
// can check that a failed stream had really committed.
async function drainEvents(stream) {
  const seen = { text: '', types: [], error: null };
  try {
    for await (const event of stream) {
      seen.types.push(event.type);
      if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') {
        seen.text += event.delta.text;
      }
    }
  } catch (err) {
    seen.error = err;
  }
  return seen;
}

test('claude-failover: stream comes from the backup channel and ends normally', T, async () => {
  const stream = await client.messages.create({ model: 'claude-failover', ...params, stream: true });
  const seen = await drainEvents(stream);
  assert.equal(seen.error, null, `stream failed: ${seen.error}`);
  assert.match(seen.text, /backup/);
  assert.equal(seen.types.at(-1), 'message_stop');
  // A failed-over stream must not replay the first channel's preamble.
  assert.equal(seen.types.filter((t) => t === 'message_start').length, 1);
});

test('claude-failover: MessageStream helper assembles the backup answer', T, async () => {
  const message = await client.messages.stream({ model: 'claude-failover', ...params }).finalMessage();
  assert.match(message.content[0].text, /backup/);
  assert.equal(message.stop_reason, 'end_turn');
});

test('claude-failover: non-streaming answer comes from the backup channel', T, async () => {
  const message = await client.messages.create({ model: 'claude-failover', ...params });
  assert.equal(message.type, 'message');
  assert.match(message.content[0].text, /backup/);
  assert.equal(message.model, 'claude-failover');
});

test('claude-down: the SDK does not retry on top of a chain the gateway already walked', T, async () => {
  // The SDK's default retries (2), counting what it sends: the gateway's
  // x-should-retry: false must make it give up after one request.
  let sent = 0;
  const retrying = new Anthropic({
    apiKey: 'sk-client-test',
    baseURL: GATEWAY_URL.replace(/\/+$/, ''),
    fetch: (url, init) => { sent++; return fetch(url, init); },
  });
  await assert.rejects(retrying.messages.create({ model: 'claude-down', ...params }), (err) => {
    assert.equal(err.status, 503);
    return true;
  });
  assert.equal(sent, 1, `the SDK sent ${sent} requests`);
});

test('claude-down: all channels failing is a 503 with an Anthropic-shaped body', T, async () => {
  await assert.rejects(client.messages.create({ model: 'claude-down', ...params }), (err) => {
    assert.ok(err instanceof APIError, `got ${err?.constructor?.name}: ${err}`);
    assert.equal(err.status, 503);
    // err.error is the whole response body for this SDK.
    assert.equal(err.error?.type, 'error');
    assert.equal(typeof err.error?.error?.type, 'string');
    assert.equal(err.type, err.error.error.type);
    return true;
  });
});

test('claude-down: streaming requests fail before any event, also with 503', T, async () => {
  await assert.rejects(client.messages.create({ model: 'claude-down', ...params, stream: true }), (err) => {
    assert.ok(err instanceof APIError, `got ${err?.constructor?.name}: ${err}`);
    assert.equal(err.status, 503);
    assert.equal(err.error?.type, 'error');
    return true;
  });
});

test('claude-cut: a stream cut after commit surfaces as an SDK error', T, async () => {
  const stream = await client.messages.create({ model: 'claude-cut', ...params, stream: true });
  const seen = await drainEvents(stream);
  assert.ok(seen.text.length > 0, 'no text arrived before the cut: the stream never committed');
  // Only `event: error` makes this SDK throw; a data-only error or a clean
  // end of body without message_stop would pass silently.
  assert.ok(seen.error instanceof APIError, `expected APIError, got ${seen.error?.constructor?.name}: ${seen.error}`);
  assert.equal(seen.error.status, undefined);
  assert.equal(seen.error.error?.type, 'error');
  assert.ok(!seen.types.includes('message_stop'), 'stream claimed a normal end');
});

test('claude-cut: the MessageStream helper rejects too', T, async () => {
  await assert.rejects(client.messages.stream({ model: 'claude-cut', ...params }).finalText(), (err) => {
    assert.ok(err instanceof APIError, `got ${err?.constructor?.name}: ${err}`);
    return true;
  });
});

const resumeText = Array.from({ length: 60 }, (_, i) => ' t' + String(i).padStart(2, '0')).join('');

test('claude-resume-tool: a continuation that goes on with a tool call keeps it, after the delivered text', T, async () => {
  const stream = client.messages.stream({
    model: 'claude-resume-tool', max_tokens: 1024,
    tools: [{ name: 'weather', description: 'The weather in a city.', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
  });
  const message = await stream.finalMessage();
  assert.equal(message.stop_reason, 'tool_use');
  assert.equal(message.content.length, 2);
  assert.equal(message.content[0].type, 'text');
  assert.equal(message.content[0].text, " I'll check the weather.");
  assert.equal(message.content[1].type, 'tool_use');
  assert.equal(message.content[1].name, 'weather');
  assert.deepEqual(message.content[1].input, { city: 'Paris' });
});

test('claude-resume: a stream cut after 40 of 60 deltas arrives whole, as one message', T, async () => {
  const stream = client.messages.stream({ model: 'claude-resume', ...params, max_tokens: 1024 }); // room for the continuation: it asks for what is left
  const message = await stream.finalMessage();
  assert.equal(message.content.length, 1);
  assert.equal(message.content[0].type, 'text');
  assert.equal(message.content[0].text, resumeText);
  assert.equal(message.stop_reason, 'end_turn');
});

test('claude-resume-46: a cut stream continued by a model with no prefill arrives whole, nothing repeated', T, async () => {
  const stream = client.messages.stream({ model: 'claude-resume-46', ...params, max_tokens: 1024 });
  const message = await stream.finalMessage();
  assert.equal(message.content.length, 1);
  assert.equal(message.content[0].type, 'text');
  assert.equal(message.content[0].text, resumeText);
  assert.equal(message.stop_reason, 'end_turn');
  assert.equal(message.model, 'claude-resume-46');
});
