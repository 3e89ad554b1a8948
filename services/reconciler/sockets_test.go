package main

import (
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// bindWithoutListen creates a Unix socket bound at path that does not
// listen yet, as a plugin between bind() and listen() is seen.
func bindWithoutListen(path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", path, err)
	}
	return fd, nil
}

// listenOn starts listening on a socket from bindWithoutListen.
func listenOn(fd int, path string) (net.Listener, error) {
	if err := unix.Listen(fd, 128); err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	return net.FileListener(f)
}
