package provider

// Credentialed is an adapter that holds its own credentials (an API key,
// access keys, a service account's private key). The handler folds them
// into the channel's identity, so that a rotated key starts with fresh
// health, and scrubs them from what it logs.
type Credentialed interface {
	Credentials() []string
}
