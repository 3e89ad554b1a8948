package kubeletreg

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// kubeletDir is where the device manager's checkpoint directory is
// (pluginapi.DevicePluginPath, under it).
const kubeletDir = "/var/lib/kubelet"

// privateKubeletDir bind-mounts root over /var/lib/kubelet in this
// process's mount namespace, which must be its own: it refuses to when the
// parent process shares it. The namespace's mounts are made private first,
// so that nothing mounted here reaches the namespace it was copied from.
// When the machine has no /var/lib/kubelet to mount over, a tmpfs mounted
// over /var/lib, in this namespace only, holds one.
func privateKubeletDir(root string) error {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err != nil {
		return fmt.Errorf("cannot tell whether the mount namespace is this process's own: %w", err)
	}
	if self == parent {
		return fmt.Errorf("%s would be the host's: start kubeletreg in a mount namespace of its own (unshare -m)", kubeletDir)
	}
	if err := os.MkdirAll(root, 0o750); err != nil {
		return err
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the mounts private: %w", err)
	}
	if _, err := os.Stat(kubeletDir); errors.Is(err, fs.ErrNotExist) {
		if err := syscall.Mount("tmpfs", filepath.Dir(kubeletDir), "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("tmpfs over %s: %w", filepath.Dir(kubeletDir), err)
		}
		if err := os.Mkdir(kubeletDir, 0o750); err != nil {
			return err
		}
	}
	if err := syscall.Mount(root, kubeletDir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over %s: %w", root, kubeletDir, err)
	}
	return nil
}
