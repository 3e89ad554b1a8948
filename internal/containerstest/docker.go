package containerstest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// RunLabel is the label the tests' docker containers carry, with the
// test's Docker.ID as its value: what the test's cleanup removes.
const RunLabel = "nodeplug.test/run"

// Docker is the host's docker engine, shared with whatever else uses it,
// holding images of ctrcmd of a test's own: the images' names, and the
// containers' names and RunLabel value, are unique to the test, and
// everything the test made is removed when it ends.
type Docker struct {
	t testing.TB
	// ID is unique to the test.
	ID string
	// Image and CmdImage are Image and CmdImage's counterparts (same
	// content), under names of the test's own.
	Image, CmdImage string
}

// NewDocker imports the test's images into the engine and checks that a
// container of Image runs; the containers labelled RunLabel=ID, named
// with Name or of the test's images, and the images, are removed when the
// test ends. When docker
// is not installed, or its engine does not answer or cannot run a
// container here, the test is skipped with the reason.
func NewDocker(t testing.TB) *Docker {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skipf("docker is not installed: %v", err)
	}
	d := &Docker{t: t, ID: randomID(t)}
	if _, err := d.docker("version", "--format", "{{.Server.Version}}"); err != nil {
		t.Skipf("the docker engine does not answer: %v", err)
	}
	bin := ctrcmd(t)
	d.Image = "localhost/nodeplug-ctrcmd-" + d.ID + ":test"
	d.CmdImage = "localhost/nodeplug-ctrcmd-" + d.ID + ":cmd"
	t.Cleanup(d.cleanup)
	tarball := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := RootfsTar(tarball, bin, "ctrcmd", "srv/"); err != nil {
		t.Fatal(err)
	}
	for image, changes := range map[string][]string{
		d.Image:    {`ENTRYPOINT ["/ctrcmd", "from-entrypoint"]`, `CMD ["from-cmd"]`},
		d.CmdImage: {`CMD ["/ctrcmd", "from-cmd"]`},
	} {
		args := []string{"import"}
		for _, c := range changes {
			args = append(args, "--change", c)
		}
		if _, err := d.docker(append(args, tarball, image)...); err != nil {
			t.Skipf("docker cannot import an image here: %v", err)
		}
	}
	if _, err := d.docker("run", "--rm", "--network=none", "--label="+RunLabel+"="+d.ID, "--name="+d.Name("probe"), d.Image); err != nil {
		t.Skipf("docker cannot run a container here: %v", err)
	}
	return d
}

// Name is a container name unique to the test, ending in name.
func (d *Docker) Name(name string) string { return "nodeplug-test-" + d.ID + "-" + name }

// Docker runs docker and returns its output; an error carries its
// stderr and fails the test.
func (d *Docker) Docker(args ...string) []byte {
	d.t.Helper()
	out, err := d.docker(args...)
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

// cleanup removes the test's containers and images.
func (d *Docker) cleanup() {
	var ids []string
	filters := []string{"label=" + RunLabel + "=" + d.ID, "name=" + d.Name(""), "ancestor=" + d.Image, "ancestor=" + d.CmdImage}
	for _, filter := range filters {
		out, err := d.docker("ps", "--all", "--quiet", "--no-trunc", "--filter="+filter)
		if err != nil {
			d.t.Errorf("listing the test's containers: %v", err)
			continue
		}
		ids = append(ids, strings.Fields(string(out))...)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if len(ids) > 0 {
		if _, err := d.docker(append([]string{"rm", "--force", "--"}, ids...)...); err != nil && !strings.Contains(err.Error(), "No such container") {
			d.t.Errorf("removing the test's containers: %v", err)
		}
	}
	for _, image := range []string{d.Image, d.CmdImage} {
		if _, err := d.docker("rmi", "--force", "--", image); err != nil && !strings.Contains(err.Error(), "No such image") {
			d.t.Errorf("removing the test's image: %v", err)
		}
	}
}

func (d *Docker) docker(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), Deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// randomID is 12 random hex digits.
func randomID(t testing.TB) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
