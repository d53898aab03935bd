// Package rotatefile is an append-only file that rotates by size and
// fsyncs every write, for the file sink and the file dead-letter: what is
// acknowledged must survive a crash, which lumberjack (no fsync) does not
// give.
//
// When a write would take the file past maxSize, the file is renamed to
// <path>.1 (older backups shift up to <path>.<maxBackups>, the oldest is
// removed) and a new file is started; a write is never split across files,
// so every file holds whole lines.
//
// It writes only regular files that no other name reaches: whenever it
// opens the file (at Open, after a rotation) it refuses a symbolic link, a
// FIFO, a device or a file with other hard links, and it works inside the
// directory as it was at Open (an os.Root), so a link created after the
// config was checked cannot make it write, rotate or remove another file
// (the checkpoint, a credential).
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
	dir        *os.Root // path's directory, as it was at Open
	name       string   // path's base name, in dir
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
	dir, err := os.OpenRoot(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	r := &File{path: path, dir: dir, name: filepath.Base(path), maxSize: maxSize, maxBackups: maxBackups}
	if err := r.open(); err != nil {
		dir.Close()
		return nil, err
	}
	return r, nil
}

// open opens the file for appending, refusing anything but a regular file
// only its own name reaches.
func (r *File) open() error {
	// O_NONBLOCK: opening a FIFO nobody reads fails instead of hanging.
	f, err := r.dir.OpenFile(r.name, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NONBLOCK, 0o640)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err == nil {
		err = r.check(st)
	}
	if err != nil {
		f.Close()
		return err
	}
	r.f, r.size = f, st.Size()
	return nil
}

// check refuses the file opened (st) unless it is a regular file reached
// by its name only: not through a link, not linked elsewhere.
func (r *File) check(st os.FileInfo) error {
	lst, err := r.dir.Lstat(r.name)
	if err != nil {
		return err
	}
	if lst.Mode()&os.ModeSymlink != 0 || !os.SameFile(st, lst) {
		return fmt.Errorf("%s is a symbolic link: refusing to write through it", r.path)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (mode %s: a FIFO, a device, a socket or a directory): refusing to write to it", r.path, st.Mode().Type())
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 {
		return fmt.Errorf("%s has %d hard links: refusing to write a file another name reaches", r.path, sys.Nlink)
	}
	return nil
}

// Write appends b (rotating first when it would take the file past
// maxSize) and fsyncs it. A full disk is reported as such.
func (r *File) Write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if r.dir == nil {
		return fmt.Errorf("%s: closed", r.path)
	}
	if r.f == nil { // a rotation failed to open the new file: again
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
		if err := r.dir.Remove(r.name); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return r.open()
	}
	_ = r.dir.Remove(r.backup(r.maxBackups))
	for i := r.maxBackups - 1; i >= 1; i-- {
		if err := r.dir.Rename(r.backup(i), r.backup(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotating: %w", err)
		}
	}
	if err := r.dir.Rename(r.name, r.backup(1)); err != nil {
		return fmt.Errorf("rotating: %w", err)
	}
	return r.open()
}

func (r *File) backup(i int) string { return r.name + "." + strconv.Itoa(i) }

// Close closes the file.
func (r *File) Close() error {
	if r.dir == nil {
		return nil
	}
	var err error
	if r.f != nil {
		err = r.f.Close()
		r.f = nil
	}
	r.dir.Close()
	r.dir = nil
	return err
}
