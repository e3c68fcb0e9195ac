// The official `openai` SDK against one GPT model served by OpenAI and two
// Azure OpenAI resources (one on the /openai/v1 path, one on the dated
// deployments path; fakes of their wire formats), one phase of failures at
// a time. Not a default `node --test` file: e2e/sdk_chain_test.go sets the
// fakes' modes for a phase, then runs `node --test chain-openai.mjs` with:
//   GATEWAY_URL   the gateway; the SDK is pointed at GATEWAY_URL + "/v1".
//   CHAIN_MODEL   the model the client asks for (the answer must name it,
//                 never the deployment or Azure's model name).
//   CHAIN_EXPECT  ok        one clean stream and one clean JSON answer;
//                 filtered  the stream passes as it is and ends with
//                           finish_reason content_filter;
//                 invalid   both requests are the client's error: a 400
//                           BadRequestError with code ERROR_CODE.
//   STREAM_FROM, STREAM_TEXT  the channel (X-Served-By) that must serve the
//                 stream and a text it must contain;
//   JSON_FROM, JSON_TEXT      the same for the non-streaming answer.
// maxRetries is 0 so the SDK's own retries cannot hide a gateway failure.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI, { BadRequestError } from 'openai';
import { env, GATEWAY_URL, MODEL, EXPECT, clientOptions, T } from './chain-env.mjs';

const client = new OpenAI({ ...clientOptions, baseURL: GATEWAY_URL + '/v1' });
const params = { model: MODEL, messages: [{ role: 'user', content: 'Say hello.' }] };

async function drain(stream) {
  const seen = { content: '', models: new Set(), finishReason: null, usage: null, error: null };
  try {
    for await (const chunk of stream) {
      seen.models.add(chunk.model);
      const choice = chunk.choices?.[0];
      seen.content += choice?.delta?.content ?? '';
      seen.finishReason = choice?.finish_reason ?? seen.finishReason;
      seen.usage = chunk.usage ?? seen.usage;
    }
  } catch (err) {
    seen.error = err;
  }
  return seen;
}

async function streamFrom(from, text, finish) {
  const { data: stream, response } = await client.chat.completions
    .create({ ...params, stream: true, stream_options: { include_usage: true } })
    .withResponse();
  assert.equal(response.headers.get('x-served-by'), from);
  const seen = await drain(stream);
  assert.equal(seen.error, null, `stream failed: ${seen.error}`);
  assert.ok(seen.content.includes(text), `content ${JSON.stringify(seen.content)}`);
  assert.deepEqual([...seen.models], [MODEL], 'every chunk names the client\'s model');
  assert.equal(seen.finishReason, finish);
  assert.ok(seen.usage?.completion_tokens > 0, 'no usage chunk');
}

if (EXPECT === 'ok') {
  test(`${MODEL}: one clean stream from ${process.env.STREAM_FROM}`, T, async () => {
    await streamFrom(env('STREAM_FROM'), env('STREAM_TEXT'), 'stop');
  });

  test(`${MODEL}: one clean JSON answer from ${process.env.JSON_FROM}`, T, async () => {
    const { data: completion, response } = await client.chat.completions.create(params).withResponse();
    assert.equal(response.headers.get('x-served-by'), env('JSON_FROM'));
    assert.equal(completion.model, MODEL);
    assert.ok(completion.choices[0].message.content.includes(env('JSON_TEXT')));
    assert.equal(completion.choices[0].finish_reason, 'stop');
  });
} else if (EXPECT === 'filtered') {
  test(`${MODEL}: a stream Azure filtered passes as it is`, T, async () => {
    await streamFrom(env('STREAM_FROM'), env('STREAM_TEXT'), 'content_filter');
  });
} else if (EXPECT === 'invalid') {
  for (const stream of [false, true]) {
    test(`${MODEL}: the provider's refusal is the client's 400 (stream: ${stream})`, T, async () => {
      await assert.rejects(client.chat.completions.create({ ...params, stream }), (err) => {
        assert.ok(err instanceof BadRequestError, `got ${err?.constructor?.name}: ${err}`);
        assert.equal(err.status, 400);
        assert.equal(err.code, env('ERROR_CODE'));
        return true;
      });
    });
  }
} else {
  throw new Error(`CHAIN_EXPECT=${EXPECT}: want ok, filtered or invalid`);
}
