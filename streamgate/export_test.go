package streamgate

// BufferCaps exposes the capacity of a Parser's line and data buffers to
// the external tests, which check that MaxEvent bounds them.
func BufferCaps(p *Parser) (line, data int) { return cap(p.line), cap(p.data) }
