// The official `@anthropic-ai/sdk` against one Claude model served by a
// chain of real-provider channels (Anthropic → Vertex → Bedrock, fakes of
// their wire formats), one phase of failures at a time. Not a default
// `node --test` file: e2e/sdk_chain_test.go sets the fakes' failure modes
// for a phase, then runs `node --test chain-anthropic.mjs` with:
//   GATEWAY_URL   the gateway; the SDK appends /v1/messages itself.
//   CHAIN_MODEL   the model the client asks for (the answer must name it,
//                 never a channel's upstream_model).
//   CHAIN_EXPECT  ok       one clean stream and one clean JSON answer;
//                 invalid  the stream request is the client's error: a 400
//                          BadRequestError whose message has ERROR_TEXT;
//                 cut      the stream commits (STREAM_TEXT arrives), then
//                          fails with `event: error`, never message_stop.
//   STREAM_FROM, STREAM_TEXT  the channel (X-Served-By) that must serve the
//                 stream and a text it must contain;
//   JSON_FROM, JSON_TEXT      the same for the non-streaming answer.
// maxRetries is 0 so the SDK's own retries cannot hide a gateway failure.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic, { APIError, BadRequestError } from '@anthropic-ai/sdk';
import { env, GATEWAY_URL, MODEL, EXPECT, clientOptions, T } from './chain-env.mjs';

const client = new Anthropic({ ...clientOptions, baseURL: GATEWAY_URL });
const params = { model: MODEL, max_tokens: 64, messages: [{ role: 'user', content: 'Say hello.' }] };

async function drain(stream) {
  const seen = { text: '', types: [], models: [], error: null };
  try {
    for await (const event of stream) {
      seen.types.push(event.type);
      if (event.type === 'message_start') seen.models.push(event.message.model);
      if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') seen.text += event.delta.text;
    }
  } catch (err) {
    seen.error = err;
  }
  return seen;
}

if (EXPECT === 'ok') {
  test(`${MODEL}: one clean stream from ${process.env.STREAM_FROM}`, T, async () => {
    const { data: stream, response } = await client.messages.create({ ...params, stream: true }).withResponse();
    assert.equal(response.headers.get('x-served-by'), env('STREAM_FROM'));
    const seen = await drain(stream);
    assert.equal(seen.error, null, `stream failed: ${seen.error}`);
    assert.ok(seen.text.includes(env('STREAM_TEXT')), `text ${JSON.stringify(seen.text)}`);
    assert.deepEqual(seen.models, [MODEL], 'exactly one message_start, naming the client\'s model');
    assert.equal(seen.types.at(-1), 'message_stop');
    assert.ok(!seen.types.includes('error'));
  });

  test(`${MODEL}: the MessageStream helper assembles the answer`, T, async () => {
    const message = await client.messages.stream(params).finalMessage();
    assert.ok(message.content[0].text.includes(env('STREAM_TEXT')));
    assert.equal(message.model, MODEL);
    assert.equal(message.stop_reason, 'end_turn');
  });

  test(`${MODEL}: one clean JSON answer from ${process.env.JSON_FROM}`, T, async () => {
    const { data: message, response } = await client.messages.create(params).withResponse();
    assert.equal(response.headers.get('x-served-by'), env('JSON_FROM'));
    assert.equal(message.type, 'message');
    assert.equal(message.model, MODEL);
    assert.ok(message.content[0].text.includes(env('JSON_TEXT')));
    assert.ok(message.usage.output_tokens > 0);
  });
} else if (EXPECT === 'invalid') {
  test(`${MODEL}: the provider's validation error is the client's 400`, T, async () => {
    await assert.rejects(client.messages.create({ ...params, stream: true }), (err) => {
      assert.ok(err instanceof BadRequestError, `got ${err?.constructor?.name}: ${err}`);
      assert.equal(err.status, 400);
      assert.equal(err.error?.type, 'error');
      assert.equal(err.type, 'invalid_request_error');
      assert.match(err.message, new RegExp(env('ERROR_TEXT')));
      return true;
    });
  });
} else if (EXPECT === 'cut') {
  test(`${MODEL}: an exception after content ends the stream with an error`, T, async () => {
    const stream = await client.messages.create({ ...params, stream: true });
    const seen = await drain(stream);
    assert.ok(seen.text.includes(env('STREAM_TEXT')), `no content before the failure: ${JSON.stringify(seen.text)}`);
    assert.ok(seen.error instanceof APIError, `expected APIError, got ${seen.error?.constructor?.name}: ${seen.error}`);
    assert.equal(seen.error.status, undefined);
    assert.ok(!seen.types.includes('message_stop'), 'stream claimed a normal end');
  });
} else {
  throw new Error(`CHAIN_EXPECT=${EXPECT}: want ok, invalid or cut`);
}
