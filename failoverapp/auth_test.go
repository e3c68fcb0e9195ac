package failoverapp

import "testing"

func TestLoopbackOnly(t *testing.T) {
	for _, tt := range []struct {
		listen []string
		want   bool
	}{
		{[]string{"127.0.0.1:8080", "[::1]:8080", "localhost:1"}, true},
		{[]string{"unix//run/caddy.sock"}, true},
		{[]string{":8080"}, false},
		{[]string{"10.0.0.1:80"}, false},
		{[]string{"127.0.0.1:80", "0.0.0.0:443"}, false},
		{nil, false},
	} {
		if got := loopbackOnly(tt.listen); got != tt.want {
			t.Errorf("loopbackOnly(%q) = %v, want %v", tt.listen, got, tt.want)
		}
	}
}
