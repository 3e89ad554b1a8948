// Package podlogs is the kubelet's layout of container logs and a reader
// of the log formats the container runtimes write into it.
//
// The kubelet keeps each container's log under /var/log/pods; nodeplug
// keeps them under its root dir instead, in the same shape:
//
//	<root>/pod-logs/
//	  <namespace>_<name>_<uid>/    one directory per pod (Dir)
//	    <container>/
//	      0.log                    the container's first start (File)
//	      1.log                    its first restart, and so on (Latest)
//
// Each file is in the CRI log format (see Reader), as podman's k8s-file
// log driver, CRI-O and containerd write it; or it is a link to the log
// docker's json-file driver writes (the dockershim's way), or a copy of
// one, which Reader reads too.
//
// The package imports only the standard library.
package podlogs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DirName is the directory beneath the root dir holding the pods' logs
// (the kubelet's /var/log/pods).
const DirName = "pod-logs"

// logSuffix ends the name of every log file: <restart>.log.
const logSuffix = ".log"

// Dir is the directory of a pod's logs beneath the root dir:
// <root>/pod-logs/<namespace>_<name>_<uid>. Namespaces and pod names are
// DNS names, which have no underscore, so the three parts can be told
// apart again.
func Dir(root, namespace, name string, uid string) string {
	return filepath.Join(root, DirName, namespace+"_"+name+"_"+uid)
}

// File is the log of a container's start number restart (0 for the
// first start) in the pod's directory: <podDir>/<container>/<restart>.log.
func File(podDir, container string, restart int) string {
	return filepath.Join(podDir, container, strconv.Itoa(restart)+logSuffix)
}

// Latest is the log of the container's latest start: the file <N>.log
// with the highest N in the container's directory, and that N. Other
// files there (the rotated logs a kubelet leaves, 0.log.<time>) are
// ignored. When the container has no log the error wraps
// os.ErrNotExist.
func Latest(podDir, container string) (path string, restart int, err error) {
	dir := filepath.Join(podDir, container)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", 0, fmt.Errorf("the logs of container %s: %w", container, err)
	}
	restart = -1
	for _, e := range entries {
		n, ok := restartOf(e.Name())
		if ok && !e.IsDir() && n > restart {
			restart = n
		}
	}
	if restart < 0 {
		return "", 0, fmt.Errorf("no <n>.log file in %s: %w", dir, os.ErrNotExist)
	}
	return File(podDir, container, restart), restart, nil
}

// restartOf is N of a file named <N>.log, where N is a decimal number
// without sign.
func restartOf(name string) (int, bool) {
	digits, ok := strings.CutSuffix(name, logSuffix)
	if !ok || digits == "" {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(digits)
	if err != nil {
		// Too many digits for an int: not a file this package wrote.
		return 0, false
	}
	return n, true
}
