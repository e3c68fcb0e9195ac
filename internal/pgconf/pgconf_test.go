package pgconf

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	for _, ok := range []string{"postgres://u:secret@db.example:5432/wallet?sslmode=disable", "host=/run/pg dbname=w", ""} {
		if err := Validate(ok); err != nil {
			t.Errorf("Validate(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"postgres://u:secret@db.example:notaport/w", "host=x sslmode=sometimes"} {
		err := Validate(bad)
		if err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("Validate(%q) = %v", bad, err)
		}
	}
}
