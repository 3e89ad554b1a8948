package stack

import (
	"errors"
	"net"
	"syscall"
)

// StaleSocket leaves a socket file at path that refuses connections, as
// plugins leave them behind. With listened, the socket was listened on and
// then closed without unlinking (a plugin killed without cleanup);
// without, it was bound but never listened on (a plugin that died between
// bind and listen).
func StaleSocket(path string, listened bool) error {
	if listened {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			return err
		}
		l.SetUnlinkOnClose(false)
		return l.Close()
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	return errors.Join(syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}), syscall.Close(fd))
}
