// The environment contract shared by chain-anthropic.mjs and
// chain-openai.mjs (see their headers): a missing variable fails the file
// at load, so a broken harness never looks green.

export const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: e2e/sdk_chain_test.go runs this file (see the header)`);
  return v;
};

export const GATEWAY_URL = env('GATEWAY_URL').replace(/\/+$/, '');
export const MODEL = env('CHAIN_MODEL');
export const EXPECT = env('CHAIN_EXPECT');
// Shorter than the test's timeout, so a hung gateway fails as an SDK error.
export const clientOptions = { apiKey: 'sk-client-test', maxRetries: 0, timeout: 15000 };
export const T = { timeout: 20000 };
