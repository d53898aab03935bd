package config

import (
	"fmt"
	"time"
)

// Duration is a time.Duration written as a Go duration string ("200ms", "1h30m").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats d like time.Duration; zero is "0s".
func (d Duration) String() string { return time.Duration(d).String() }

// parseScalar is how the decoder fills a Duration.
func (d *Duration) parseScalar(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q (want e.g. 200ms, 5s, 1h)", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes d back in the form it is read.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }
