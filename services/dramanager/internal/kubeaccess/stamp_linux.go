package kubeaccess

import (
	"os"
	"syscall"
)

// stampOf is a file's modification time, size and inode: a kubeconfig
// replaced by rename (as nodeplug-apiserver writes it) gets a new inode.
func stampOf(fi os.FileInfo) stamp {
	s := stamp{mtime: fi.ModTime(), size: fi.Size()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}
