package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// MaxBackups bounds how many rotated files a file sink or a file
// dead-letter keeps: each rotation renames every one of them.
const MaxBackups = 100

// OutputFile is a file the bridge appends to and rotates: a file sink's
// path or a file dead-letter.
type OutputFile struct {
	Path       string // the config key path, e.g. sinks[2].deadLetter.file
	File       string
	MaxBackups int // rotation also writes File.1 ... File.<MaxBackups>
}

// OutputFiler is a sink type's config block that names files the sink
// writes (the file sink); the keys of its OutputFiles are relative to the
// block.
type OutputFiler interface {
	OutputFiles() []OutputFile
}

// OutputFiles lists the files cfg has the bridge write, in config order.
func OutputFiles(cfg *Config) []OutputFile {
	var out []OutputFile
	for i, s := range cfg.Sinks {
		if f, ok := s.Spec.(OutputFiler); ok && s.Type != "" {
			for _, o := range f.OutputFiles() {
				o.Path = fmt.Sprintf("sinks[%d].%s.%s", i, s.Type, o.Path)
				out = append(out, o)
			}
		}
		if d := s.DeadLetter; d != nil && d.File != "" {
			out = append(out, OutputFile{Path: fmt.Sprintf("sinks[%d].deadLetter.file", i), File: d.File, MaxBackups: d.MaxBackups})
		}
	}
	return out
}

// Protected are files besides the config's outputs and credentials that an
// output file must never be.
type Protected struct {
	ConfigFile     string // the config file itself
	CheckpointFile string // the checkpoint's bbolt file; empty with natsKV
}

// specialDirs hold special files (devices, processes, kernel settings):
// never a place to append events to.
var specialDirs = []string{"/dev", "/proc", "/sys"}

// ConfineOutputFiles checks the files cfg has the bridge write (file
// sinks, file dead-letters), each with its rotated copies: a config editor
// must not be able to make the bridge overwrite or rotate away its
// checkpoint, its config, another output or a credential file the config
// names. Each must be an absolute path outside the pod's service-account
// directory, /dev, /proc and /sys, and no two may share a file. With resolve (bridge run), symbolic links in the
// directories are followed, and a file that exists must be a regular file
// with no other link to it: the bridge never writes through a link, a
// device or a FIFO (pkg/internal/rotatefile checks again whenever it opens one).
func ConfineOutputFiles(cfg *Config, p Protected, resolve bool) []Problem {
	taken := map[string]string{} // a file's forms -> what writes it, or what it is
	protect := func(file, what string) {
		if abs, err := filepath.Abs(file); file != "" && err == nil {
			for _, f := range forms(abs, resolve) {
				taken[f] = what
			}
		}
	}
	protect(p.ConfigFile, "the config file")
	protect(p.CheckpointFile, "the checkpoint file")
	for _, c := range CredentialFiles(cfg) {
		protect(c.File, "the credential file of "+c.Path)
	}
	var problems []Problem
	for _, o := range OutputFiles(cfg) {
		msg := confineOutput(o, resolve)
		names := family(o)
	check:
		for k, name := range names {
			for _, f := range forms(name, resolve) {
				if msg != "" {
					break check
				}
				what, ok := taken[f]
				switch {
				case !ok:
				case k > 0:
					msg = fmt.Sprintf("%s would replace %s (%s) when it rotates", o.File, what, f)
				case f != o.File:
					msg = fmt.Sprintf("%s is %s (%s)", o.File, what, f)
				default:
					msg = fmt.Sprintf("%s is %s", o.File, what)
				}
			}
		}
		if msg != "" {
			problems = append(problems, Problem{Path: o.Path, Line: cfg.LineOf(o.Path), Message: msg})
			continue
		}
		for _, name := range names {
			for _, f := range forms(name, resolve) {
				taken[f] = o.Path + "'s file or one of its rotated copies"
			}
		}
	}
	return problems
}

// family is o's file and its rotated copies, clean.
func family(o OutputFile) []string {
	clean := filepath.Clean(o.File)
	names := []string{clean}
	for k := 1; k <= min(o.MaxBackups, MaxBackups); k++ {
		names = append(names, clean+"."+strconv.Itoa(k))
	}
	return names
}

// confineOutput checks where one output file is; "" when it may be written.
func confineOutput(o OutputFile, resolve bool) string {
	if !filepath.IsAbs(o.File) {
		return fmt.Sprintf("%s is not an absolute path", o.File)
	}
	clean := filepath.Clean(o.File)
	for _, f := range forms(clean, resolve) {
		shown := o.File
		if f != o.File {
			shown = o.File + " (that is " + f + ")"
		}
		for _, d := range specialDirs {
			if within(f, d) {
				return fmt.Sprintf("%s is in %s, which holds special files, not files to append to (\"-\" writes to stdout)", shown, d)
			}
		}
		for _, d := range forbiddenCredentialDirs {
			if within(f, d) {
				return fmt.Sprintf("%s is in the pod's service-account directory (%s)", shown, d)
			}
		}
	}
	if !resolve {
		return ""
	}
	st, err := os.Lstat(clean)
	switch {
	case err != nil:
		return "" // created at start
	case st.Mode()&os.ModeSymlink != 0:
		return fmt.Sprintf("%s is a symbolic link: the bridge writes only regular files, never through a link", o.File)
	case !st.Mode().IsRegular():
		return fmt.Sprintf("%s is %s, not a regular file: the bridge writes only regular files", o.File, describeMode(st.Mode()))
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 {
		return fmt.Sprintf("%s has %d hard links: the bridge writes only files no other name reaches", o.File, sys.Nlink)
	}
	return ""
}

// describeMode names a file type that is not a regular file.
func describeMode(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "a special file"
}

// forms are the names of the clean absolute path p: p, and with resolve
// also p with the symbolic links of its longest existing part followed.
func forms(p string, resolve bool) []string {
	if !resolve {
		return []string{p}
	}
	if r := resolveExisting(p); r != p {
		return []string{p, r}
	}
	return []string{p}
}

// resolveExisting follows the symbolic links of the longest part of p that
// exists, and appends the rest.
func resolveExisting(p string) string {
	rest := ""
	for dir := p; ; dir = filepath.Dir(dir) {
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(r, rest)
		}
		if dir == filepath.Dir(dir) {
			return p
		}
		rest = filepath.Join(filepath.Base(dir), rest)
	}
}
