// The official `openai` SDK against a running caddy-llm-failover gateway.
//
// Contract with whoever starts the gateway (a Go test, see README.md):
//   GATEWAY_URL    base URL of the gateway, e.g. http://127.0.0.1:9080; the
//                  SDK is pointed at GATEWAY_URL + "/v1".
//   gpt-failover   chat; channel 1 answers 503, channel 2 serves normally with
//                  content containing "backup".
//   gpt-bad-request chat; the upstream answers 400
//                  {"error":{"message":"bad thing","type":"invalid_request_error","code":"bad"}}.
//   no-such-model  not configured: the gateway answers 404 OpenAI-style with
//                  code "model_not_found".
//   gpt-down       chat; every channel answers 503: the gateway answers 503
//                  with a message that names the model.
//   gpt-cut        chat; the stream commits (some content reaches the client),
//                  then the upstream cuts the connection: the gateway must end
//                  the stream with a final `data: {"error":...}` event.
//   gpt-responses  Responses API; streams normally with text containing
//                  "backup" (the gateway may fail over to get there).
//   gpt-resume     chat with stream_resume continue; channel 1 streams
//                  content " t00".." t59" and cuts after the 40th, channel 2
//                  (provider openai { continuation prefix }) streams
//                  " t40".." t59": the SDK must see one completion with the
//                  whole text.
//   gpt-resume-instructed  the same cut, continued by a channel with no
//                  prefill (the OpenAI API), asked in words; it repeats the
//                  delivered tail first: one completion, the exact text.
// Clients use apiKey "sk-client-test"; the gateway must not forward it.
//
// maxRetries is 0 everywhere so the SDK's own retries cannot hide (or
// multiply) what the gateway did, except where a test checks the retries.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI, { APIError, BadRequestError, NotFoundError, InternalServerError } from 'openai';

const GATEWAY_URL = process.env.GATEWAY_URL;
if (!GATEWAY_URL) {
  throw new Error('GATEWAY_URL is not set: these tests need a running gateway (see README.md)');
}

// Shorter than the per-test timeout so a hung gateway fails as an SDK error
// with a message, not as an anonymous test timeout.
const client = new OpenAI({
  apiKey: 'sk-client-test',
  baseURL: GATEWAY_URL.replace(/\/+$/, '') + '/v1',
  maxRetries: 0,
  timeout: 15000,
});

const T = { timeout: 20000 };
const messages = [{ role: 'user', content: 'Say hello.' }];

// Drains a chat stream, keeping what arrived before any error so tests can
// check that a failed stream had really committed.
async function drainChat(stream) {
  const seen = { content: '', chunks: 0, finishReason: null, error: null };
  try {
    for await (const chunk of stream) {
      seen.chunks++;
      const choice = chunk.choices?.[0];
      seen.content += choice?.delta?.content ?? '';
      seen.finishReason = choice?.finish_reason ?? seen.finishReason;
    }
  } catch (err) {
    seen.error = err;
  }
  return seen;
}

test('gpt-failover: non-streaming answer comes from the backup channel', T, async () => {
  const completion = await client.chat.completions.create({ model: 'gpt-failover', messages });
  assert.match(completion.choices[0].message.content, /backup/);
  assert.equal(completion.choices[0].finish_reason, 'stop');
  assert.equal(completion.model, 'gpt-failover');
});

test('gpt-failover: stream comes from the backup channel and ends normally', T, async () => {
  const stream = await client.chat.completions.create({
    model: 'gpt-failover',
    messages,
    stream: true,
    stream_options: { include_usage: true },
  });
  const seen = await drainChat(stream);
  assert.equal(seen.error, null, `stream failed: ${seen.error}`);
  assert.match(seen.content, /backup/);
  assert.equal(seen.finishReason, 'stop');
});

test('gpt-bad-request: the upstream 400 reaches the client as BadRequestError', T, async () => {
  await assert.rejects(client.chat.completions.create({ model: 'gpt-bad-request', messages }), (err) => {
    assert.ok(err instanceof BadRequestError, `got ${err?.constructor?.name}: ${err}`);
    assert.equal(err.status, 400);
    assert.equal(err.error?.message, 'bad thing');
    assert.equal(err.code, 'bad');
    assert.equal(err.type, 'invalid_request_error');
    return true;
  });
});

test('no-such-model: NotFoundError with code model_not_found', T, async () => {
  await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages }), (err) => {
    assert.ok(err instanceof NotFoundError, `got ${err?.constructor?.name}: ${err}`);
    assert.equal(err.status, 404);
    assert.equal(err.code, 'model_not_found');
    return true;
  });
});

test('gpt-down: all channels failing is a 503 that names the model', T, async () => {
  await assert.rejects(client.chat.completions.create({ model: 'gpt-down', messages }), (err) => {
    assert.ok(err instanceof InternalServerError, `got ${err?.constructor?.name}: ${err}`);
    assert.equal(err.status, 503);
    assert.match(err.message, /gpt-down/);
    return true;
  });
});

test('gpt-down: the SDK does not retry on top of a chain the gateway already walked', T, async () => {
  // The SDK's default retries (2), counting what it sends: the gateway's
  // x-should-retry: false must make it give up after one request.
  let sent = 0;
  const retrying = new OpenAI({
    apiKey: 'sk-client-test',
    baseURL: GATEWAY_URL.replace(/\/+$/, '') + '/v1',
    fetch: (url, init) => { sent++; return fetch(url, init); },
  });
  await assert.rejects(retrying.chat.completions.create({ model: 'gpt-down', messages }), (err) => {
    assert.equal(err.status, 503);
    return true;
  });
  assert.equal(sent, 1, `the SDK sent ${sent} requests`);
});

test('gpt-down: streaming requests fail before any chunk, also with 503', T, async () => {
  await assert.rejects(client.chat.completions.create({ model: 'gpt-down', messages, stream: true }), (err) => {
    assert.ok(err instanceof APIError, `got ${err?.constructor?.name}: ${err}`);
    assert.equal(err.status, 503);
    return true;
  });
});

test('gpt-cut: a stream cut after commit ends in an error, not a normal end', T, async () => {
  const stream = await client.chat.completions.create({ model: 'gpt-cut', messages, stream: true });
  const seen = await drainChat(stream);
  assert.ok(seen.content.length > 0, 'no content arrived before the cut: the stream never committed');
  // The SDK treats a clean end of body as success even without [DONE], so
  // only the gateway's trailing error event lets the client notice the cut.
  // An in-band error surfaces as a plain APIError without an HTTP status.
  assert.ok(seen.error instanceof APIError, `expected APIError, got ${seen.error?.constructor?.name}: ${seen.error}`);
  assert.equal(seen.error.status, undefined);
  assert.notEqual(seen.finishReason, 'stop');
});

test('gpt-responses: Responses API stream yields text from the backup channel', T, async () => {
  const stream = await client.responses.create({ model: 'gpt-responses', input: 'Say hello.', stream: true });
  let text = '';
  let completed = null;
  for await (const event of stream) {
    if (event.type === 'response.output_text.delta') text += event.delta;
    if (event.type === 'response.completed') completed = event.response;
  }
  assert.match(text, /backup/);
  assert.ok(completed, 'no response.completed event');
  assert.equal(completed.status, 'completed');
  assert.match(completed.output_text ?? completed.output[0].content[0].text, /backup/);
});

test('gpt-responses: non-streaming Responses API output_text', T, async () => {
  const response = await client.responses.create({ model: 'gpt-responses', input: 'Say hello.' });
  assert.equal(response.status, 'completed');
  assert.match(response.output_text, /backup/);
});

const resumeText = Array.from({ length: 60 }, (_, i) => ' t' + String(i).padStart(2, '0')).join('');

test('gpt-resume: a stream cut after 40 of 60 chunks arrives whole, as one completion', T, async () => {
  const stream = client.chat.completions.stream({
    model: 'gpt-resume', messages, stream_options: { include_usage: true },
  });
  const ids = new Set();
  let roles = 0;
  let usage = 0;
  for await (const chunk of stream) {
    ids.add(chunk.id);
    if (chunk.choices?.[0]?.delta?.role) roles++;
    if (chunk.usage) usage++;
  }
  const completion = await stream.finalChatCompletion();
  assert.equal(completion.choices.length, 1);
  assert.equal(completion.choices[0].message.content, resumeText);
  assert.equal(completion.choices[0].finish_reason, 'stop');
  assert.equal(completion.model, 'gpt-resume');
  assert.equal(ids.size, 1, `chunk ids ${[...ids]}`);
  assert.equal(roles, 1);
  assert.equal(usage, 1);
});

test('gpt-resume-instructed: a cut stream continued where there is no prefill arrives whole, nothing repeated', T, async () => {
  const stream = client.chat.completions.stream({
    model: 'gpt-resume-instructed', messages, stream_options: { include_usage: true },
  });
  const ids = new Set();
  let roles = 0;
  for await (const chunk of stream) {
    ids.add(chunk.id);
    if (chunk.choices?.[0]?.delta?.role) roles++;
  }
  const completion = await stream.finalChatCompletion();
  assert.equal(completion.choices.length, 1);
  assert.equal(completion.choices[0].message.content, resumeText);
  assert.equal(completion.choices[0].finish_reason, 'stop');
  assert.equal(completion.model, 'gpt-resume-instructed');
  assert.equal(ids.size, 1, `chunk ids ${[...ids]}`);
  assert.equal(roles, 1);
});
