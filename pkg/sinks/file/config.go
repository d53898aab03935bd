package file

import (
	"errors"

	"github.com/kubebridge/kubebridge/pkg/config"
)

// Defaults, named so that docs and code agree.
const (
	DefaultMaxSizeMB  = 100
	DefaultMaxBackups = 5
)

// Config is the file sink's type block: it appends events as JSON lines.
type Config struct {
	// Path of the file; "-" writes to stdout. Required. An absolute path, confined as deadLetter.file is (docs/security.md).
	Path string `yaml:"path"`
	// MaxSizeMB rotates the file when it reaches this size. Default 100.
	MaxSizeMB int `yaml:"maxSizeMB"`
	// MaxBackups is how many rotated files are kept, at most 100. Default 5.
	MaxBackups int `yaml:"maxBackups"`
}

// SetDefaults rotates at 100 MB and keeps 5 old files.
func (f *Config) SetDefaults() {
	f.MaxSizeMB = DefaultMaxSizeMB
	f.MaxBackups = DefaultMaxBackups
}

// Validate checks the path and rotation bounds.
func (f *Config) Validate() error {
	var errs []error
	if f.Path == "" {
		errs = append(errs, config.ErrorAt("path", `required (a file path, or "-" for stdout)`))
	}
	if f.MaxSizeMB < 1 || f.MaxSizeMB > 1<<20 { // 1 TiB: more would wrap negative in bytes
		errs = append(errs, config.ErrorAt("maxSizeMB", "must be between 1 and 1048576 (1 TiB), got %d", f.MaxSizeMB))
	}
	if f.MaxBackups < 0 {
		errs = append(errs, config.ErrorAt("maxBackups", "must not be negative, got %d", f.MaxBackups))
	} else if f.MaxBackups > config.MaxBackups {
		errs = append(errs, config.ErrorAt("maxBackups", "must be at most %d (each rotation renames every copy), got %d", config.MaxBackups, f.MaxBackups))
	}
	return errors.Join(errs...)
}

// OutputFiles is the file the sink appends to (none for stdout), which
// config.ConfineOutputFiles keeps apart from the checkpoint, the config,
// credentials and other outputs.
func (f *Config) OutputFiles() []config.OutputFile {
	if f.Path == "-" || f.Path == "" {
		return nil
	}
	return []config.OutputFile{{Path: "path", File: f.Path, MaxBackups: f.MaxBackups}}
}
