// Package rotatefile is an append-only file that rotates by size and
// fsyncs every write, for the file sink and the file dead-letter: what is
// acknowledged must survive a crash, which lumberjack (no fsync) does not
// give.
//
// When a write would take the file past maxSize, the file is renamed to
// <path>.1 (older backups shift up to <path>.<maxBackups>, the oldest is
// removed) and a new file is started; a write is never split across files,
// so every file holds whole lines.
package rotatefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// File is a rotating file. It is not safe for concurrent use.
type File struct {
	path       string
	maxSize    int64
	maxBackups int
	f          *os.File
	size       int64
}

// Open opens (creating it and its directory) the file at path for
// appending; it rotates at maxSize bytes keeping maxBackups old files.
func Open(path string, maxSize int64, maxBackups int) (*File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	r := &File{path: path, maxSize: maxSize, maxBackups: maxBackups}
	if err := r.open(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *File) open() error {
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	r.f, r.size = f, st.Size()
	return nil
}

// Write appends b (rotating first when it would take the file past
// maxSize) and fsyncs it. A full disk is reported as such.
func (r *File) Write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if r.f == nil {
		if err := r.open(); err != nil {
			return err
		}
	}
	if r.size > 0 && r.size+int64(len(b)) > r.maxSize {
		if err := r.rotate(); err != nil {
			return err
		}
	}
	n, err := r.f.Write(b)
	r.size += int64(n)
	if err == nil {
		err = r.f.Sync()
	}
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return fmt.Errorf("%s: disk full: %w", r.path, err)
		}
		return fmt.Errorf("%s: %w", r.path, err)
	}
	return nil
}

// rotate shifts path.N-1 -> path.N ... path -> path.1 and opens a new path.
func (r *File) rotate() error {
	if err := r.f.Close(); err != nil {
		return fmt.Errorf("closing for rotation: %w", err)
	}
	r.f = nil
	if r.maxBackups == 0 {
		if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return r.open()
	}
	_ = os.Remove(r.backup(r.maxBackups))
	for i := r.maxBackups - 1; i >= 1; i-- {
		if err := os.Rename(r.backup(i), r.backup(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotating: %w", err)
		}
	}
	if err := os.Rename(r.path, r.backup(1)); err != nil {
		return fmt.Errorf("rotating: %w", err)
	}
	return r.open()
}

func (r *File) backup(i int) string { return r.path + "." + strconv.Itoa(i) }

// Close closes the file.
func (r *File) Close() error {
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}
