package provider

import "unicode/utf8"

// TokenEstimator estimates how many tokens a modern BPE tokenizer
// (OpenAI's cl100k_base and o200k_base; Anthropic's is close) splits a
// text into, from the text alone. Billing uses it only when an upstream
// reported no usage: for the output actually delivered (the decoded
// content deltas, never SSE framing) and for a request's input.
//
// The rule, per run of characters of one class:
//   - a word (ASCII letters) is one token per started 8 letters: common
//     words are single tokens, long ones split; like a space, one symbol
//     right before a word joins it ("(b", ".buf");
//   - a number is one token per started 3 digits, as those tokenizers
//     group digits in threes;
//   - a run of punctuation or symbols is one token per 2 characters
//     ("()", ":=", "//" are mostly single tokens);
//   - a run of whitespace holding a newline, a tab or several spaces is one
//     token (indentation goes with its newline); the single space before a
//     word belongs to the word;
//   - any other character (accented, CJK, emoji) is one token each.
//
// TestTokenEstimator pins it within 10% of cl100k_base and o200k_base for
// English prose, chat answers, Go and Python code. It keeps only counters,
// so it can follow a stream of any length, and text may arrive in pieces
// split anywhere (a multi-byte character too). The zero value is ready.
type TokenEstimator struct {
	tokens int64
	class  charClass
	run    int64 // length of the current run of class
	// keep, when set, also keeps the text written (Meter.KeepText).
	keep *textKeeper
}

type charClass uint8

const (
	classNone charClass = iota
	classLetter
	classDigit
	classPunct
	classSpace
	classNewline
	classOther
)

// Write adds text to the estimate.
func (e *TokenEstimator) Write(text []byte) {
	for _, c := range text {
		e.byte(c)
	}
}

func (e *TokenEstimator) byte(c byte) {
	switch {
	case c < utf8.RuneSelf:
		e.add(asciiClass(c))
	case utf8.RuneStart(c):
		// One token per non-ASCII character, counted at its first byte,
		// so a character split between writes counts once.
		e.add(classOther)
	}
}

// writeJSONString adds the text of a raw JSON string's contents, its
// escapes read as the characters they stand for.
func (e *TokenEstimator) writeJSONString(raw []byte) {
	if e.keep != nil {
		e.keep.add(raw)
	}
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' || i+1 == len(raw) {
			e.byte(c)
			continue
		}
		i++
		switch raw[i] {
		case 'n', 't', 'r':
			e.add(classNewline)
		case 'u':
			// \uXXXX: mostly a non-ASCII character.
			e.add(classOther)
			i += min(4, len(raw)-1-i)
		default: // \" \\ \/ \b \f
			e.byte(raw[i])
		}
	}
}

// WriteString adds text to the estimate.
func (e *TokenEstimator) WriteString(text string) { e.Write([]byte(text)) }

// Tokens returns the estimate of everything written so far.
func (e *TokenEstimator) Tokens() int64 {
	return e.tokens + runTokens(e.class, e.run)
}

func asciiClass(c byte) charClass {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		return classLetter
	case c >= '0' && c <= '9':
		return classDigit
	case c == ' ':
		return classSpace
	case c == '\n' || c == '\r' || c == '\t':
		return classNewline
	case c < ' ' || c == 0x7f:
		return classOther
	}
	return classPunct
}

func (e *TokenEstimator) add(c charClass) {
	if c == e.class && c != classOther {
		e.run++
		return
	}
	if c == classSpace && e.class == classNewline || c == classNewline && e.class == classSpace {
		// Indentation after a newline is one token with it.
		e.class = classNewline
		e.run++
		return
	}
	if c == classLetter && e.class == classPunct {
		// Like a space, one symbol before a word joins it ("(b", ".buf").
		e.run--
	}
	e.tokens += runTokens(e.class, e.run)
	e.class, e.run = c, 1
}

// runTokens is the estimate for a finished run of n characters of class c.
func runTokens(c charClass, n int64) int64 {
	if n == 0 {
		return 0
	}
	switch c {
	case classLetter:
		return (n + 7) / 8
	case classDigit:
		return (n + 2) / 3
	case classPunct:
		return (n + 1) / 2
	case classSpace:
		if n == 1 {
			return 0
		}
		return 1
	case classNewline:
		return 1
	case classOther:
		return n
	}
	return 0
}

// EstimateTokens estimates the tokens of a whole text (see TokenEstimator).
func EstimateTokens(text []byte) int64 {
	var e TokenEstimator
	e.Write(text)
	return e.Tokens()
}
