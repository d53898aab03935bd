package exec

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
)

// DefaultInflight and MaxInflight bound Config.Inflight; DefaultTimeout is
// Config.Timeout's default.
const (
	DefaultInflight = 256
	MaxInflight     = 100000
	DefaultTimeout  = 30 * time.Second
)

// Config is the exec sink's type block: it runs a plugin, a program in any
// language, writing events to its stdin and reading its answers on stdout
// (protocol kubebridge.exec/v1, docs/plugins.md).
type Config struct {
	// Command is the plugin's argv (no shell): the program, looked up in the bridge's PATH, then its arguments. Required.
	Command []string `yaml:"command"`
	// Env adds variables to the plugin's environment, which otherwise holds only PATH, HOME and LANG from the bridge's (no other variable of the bridge, secrets included, reaches the plugin). Default: none.
	Env map[string]string `yaml:"env"`
	// Inflight is how many events may be written to the plugin and not yet answered, across all workers. Default 256.
	Inflight int `yaml:"inflight"`
	// Timeout bounds the wait for an event's answer; a plugin that does not answer in time is killed and restarted, and its unanswered events are resent. Default 30s.
	Timeout config.Duration `yaml:"timeout"`
}

// SetDefaults sets the defaults before the YAML is decoded into c.
func (c *Config) SetDefaults() {
	c.Inflight = DefaultInflight
	c.Timeout = config.Duration(DefaultTimeout)
}

// Validate checks the command, the variable names, the inflight bound and
// the timeout.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Command) == 0 {
		errs = append(errs, config.ErrorAt("command", "required: the plugin's program and its arguments, e.g. [python3, /plugins/audit.py]"))
	} else if c.Command[0] == "" {
		errs = append(errs, config.ErrorAt("command[0]", "must name the program, got an empty string"))
	}
	for i, arg := range c.Command {
		if strings.IndexByte(arg, 0) >= 0 {
			errs = append(errs, config.ErrorAt(fmt.Sprintf("command[%d]", i), "contains a NUL byte"))
		}
	}
	keys := make([]string, 0, len(c.Env))
	for k := range c.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00"):
			errs = append(errs, config.ErrorAt(config.JoinKey("env", k), "%q is not a variable name (non-empty, without '=' or NUL)", k))
		case strings.IndexByte(c.Env[k], 0) >= 0: // the value itself is never printed: it may be a secret
			errs = append(errs, config.ErrorAt(config.JoinKey("env", k), "the value contains a NUL byte"))
		}
	}
	if c.Inflight < 1 || c.Inflight > MaxInflight {
		errs = append(errs, config.ErrorAt("inflight", "must be between 1 and %d, got %d", MaxInflight, c.Inflight))
	}
	if c.Timeout <= 0 {
		errs = append(errs, config.ErrorAt("timeout", "must be positive, got %s", c.Timeout))
	}
	return errors.Join(errs...)
}
