package breaker

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// httpDateLayouts are the three HTTP-date forms RFC 9110 section 5.6.7
// obliges recipients to accept. They are spelled out here instead of using
// net/http.ParseTime to keep this package free of net/http.
var httpDateLayouts = [...]string{
	"Mon, 02 Jan 2006 15:04:05 GMT",  // IMF-fixdate
	"Monday, 02-Jan-06 15:04:05 GMT", // obsolete RFC 850
	"Mon Jan _2 15:04:05 2006",       // obsolete asctime
}

// maxDelaySeconds is the largest delta-seconds that fits a time.Duration.
const maxDelaySeconds = math.MaxInt64 / int64(time.Second)

// ParseRetryAfter parses a Retry-After header value, either delta-seconds
// or an HTTP-date, into a delay from now. ok is false when v is empty or
// not a valid value (including negative or fractional seconds). A date in
// the past yields 0 with ok true. Absurdly large values saturate rather
// than fail; Park caps them at MaxPark anyway.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > maxDelaySeconds {
			// Only overflow can fail here since v is all digits.
			return time.Duration(math.MaxInt64), true
		}
		return time.Duration(secs) * time.Second, true
	}
	for _, layout := range httpDateLayouts {
		t, err := time.Parse(layout, v)
		if err != nil {
			continue
		}
		if d := t.Sub(now); d > 0 {
			return d, true
		}
		return 0, true
	}
	return 0, false
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
