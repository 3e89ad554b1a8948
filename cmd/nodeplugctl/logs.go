package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/pkg/podlogs"
)

const logsArgs = "NS/NAME | NAME [-n NS] [-c CONTAINER] [-p] [--timestamps] [--tail N] [-o text|json|yaml] [--kubeconfig PATH]"

// defaultContainerAnnotation names the container kubectl logs reads when
// none is given (kubectl's annotation).
const defaultContainerAnnotation = "kubectl.kubernetes.io/default-container"

// logLine is one line of a container's log, as -o json and yaml write it.
type logLine struct {
	Time   time.Time `json:"time"`
	Stream string    `json:"stream"`
	Log    string    `json:"log"`
}

// cmdLogs prints a container's log from the files the runtime writes under
// the root dir (<root-dir>/pod-logs/<ns>_<name>_<uid>/<container>/<n>.log,
// the kubelet's layout), as kubectl logs prints it.
func cmdLogs(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("logs", logsArgs)
	out := c.outputFlag(fs, "text", "json", "yaml")
	kubeconfig := fs.String("kubeconfig", "", readKubeconfigUsage)
	namespace := fs.String("namespace", metav1.NamespaceDefault, "the pod's namespace when NAME names none")
	fs.StringVar(namespace, "n", metav1.NamespaceDefault, "same as --namespace")
	container := fs.String("container", "", "the container (default: the pod's only container, else its "+defaultContainerAnnotation+" annotation's, else its first)")
	fs.StringVar(container, "c", "", "same as --container")
	previous := fs.Bool("previous", false, "the log of the container's previous start")
	fs.BoolVar(previous, "p", false, "same as --previous")
	timestamps := fs.Bool("timestamps", false, "begin each line with its time (RFC 3339)")
	tail := fs.Int("tail", -1, "only the last N lines (-1: all)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := checkOutput(*out, "text", "json", "yaml"); err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("name one pod: logs NS/NAME [-c CONTAINER]")
	}
	ns, name, err := splitPodRef(strings.TrimPrefix(pos[0], "pod/"), *namespace, namespaceGiven(fs))
	if err != nil {
		return err
	}
	cs, host, err := c.readClient(*kubeconfig)
	if err != nil {
		return err
	}
	pod, err := getPod(ctx, cs, host, ns, name)
	if err != nil {
		return err
	}
	ctr, err := logContainer(c, pod, *container)
	if err != nil {
		return err
	}
	path, err := c.logFile(pod, ctr, *previous)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("the log of container %s of pod %s/%s: %w", ctr, ns, name, err)
	}
	defer func() { _ = f.Close() }()
	opts := podlogs.Options{Timestamps: *timestamps, TailLines: *tail}
	if *out == "text" {
		return podlogs.Copy(c.stdout, f, opts)
	}
	entries, err := podlogs.Read(f, opts)
	if err != nil {
		return fmt.Errorf("the log %s: %w", path, err)
	}
	lines := make([]logLine, 0, len(entries))
	for _, e := range entries {
		lines = append(lines, logLine{Time: e.Time, Stream: e.Stream, Log: string(e.Content)})
	}
	return writeObject(c.stdout, *out, lines)
}

// logContainer is the container named, or the pod's default one.
func logContainer(c *cli, pod *corev1.Pod, named string) (string, error) {
	var names []string
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, ctr := range cs {
			names = append(names, ctr.Name)
		}
	}
	if named != "" {
		for _, n := range names {
			if n == named {
				return n, nil
			}
		}
		return "", fmt.Errorf("container %s is not in pod %s/%s; its containers: %s", named, pod.Namespace, pod.Name, strings.Join(names, ", "))
	}
	if len(pod.Spec.Containers) == 1 {
		return pod.Spec.Containers[0].Name, nil
	}
	def := pod.Annotations[defaultContainerAnnotation]
	for _, ctr := range pod.Spec.Containers {
		if ctr.Name == def {
			return def, nil
		}
	}
	def = pod.Spec.Containers[0].Name
	_, _ = fmt.Fprintf(c.stderr, "Defaulted container %q out of: %s\n", def, strings.Join(names, ", "))
	return def, nil
}

// logFile is the file of the container's latest start (or the one
// before, previous).
func (c *cli) logFile(pod *corev1.Pod, container string, previous bool) (string, error) {
	dir := podlogs.Dir(c.g.rootDir, pod.Namespace, pod.Name, string(pod.UID))
	path, restart, err := podlogs.Latest(dir, container)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("container %s of pod %s/%s has no log in %s: it has not started (nodeplugctl describe pod %s/%s says why)",
			container, pod.Namespace, pod.Name, dir, pod.Namespace, pod.Name)
	}
	if err != nil {
		return "", err
	}
	if previous {
		if restart == 0 {
			return "", fmt.Errorf("container %s of pod %s/%s has not been restarted: there is no previous log", container, pod.Namespace, pod.Name)
		}
		path = podlogs.File(dir, container, restart-1)
	}
	return path, nil
}
