package fakeproviders

// ClaudeChain is the llm_failover block the tests use for one Claude model
// on Anthropic, Vertex and Bedrock, cheapest first in that order, each
// with its own model id, against these fakes. Its verbs are, in order: the
// Anthropic upstream's URL, the Vertex fake's URL, the service-account
// JSON's path (Vertex.WriteServiceAccount), the Bedrock fake's URL. The
// in-process tests and the end-to-end SDK test share it.
const ClaudeChain = `
		channel anthropic-direct %s {
			provider anthropic
			header X-Api-Key sk-ant-test
		}
		channel google-vertex %s {
			provider vertex {
				project proj-1
				region us-east5
				credentials_file %s
			}
		}
		channel aws-bedrock %s {
			provider bedrock {
				region us-east-1
				access_key_id AKIAFAKE
				secret_access_key fake-secret
			}
		}
		breaker {
			failures 64
		}
		model claude-sonnet-4-5 {
			route anthropic-direct cost 3 15 upstream_model claude-sonnet-4-5-20250929
			route google-vertex cost 4 16 upstream_model claude-sonnet-4-5@20250929
			route aws-bedrock cost 5 17 upstream_model us.anthropic.claude-sonnet-4-5-20250929-v1:0
		}
`
