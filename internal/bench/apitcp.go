package bench

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/nodeplug/nodeplug/internal/certs"
	"github.com/nodeplug/nodeplug/pkg/access"
	"github.com/nodeplug/nodeplug/pkg/app"
)

// APITCP is -api-tcp: each service also serves its API on a free loopback
// TCP port (--listen-tcp 127.0.0.1:0), and the bench's own API calls (its
// devicemanager and reconciler clients: List*, Watch*, Allocate, Release)
// go there over mutual TLS, through app.TLS.Dial as nodeplugctl's do. The
// services still reach one another on their Unix sockets, and plugins are
// still Unix sockets.
type APITCP struct {
	// Client is the bench's client side: -tls-cert-file, -tls-key-file,
	// -tls-ca-file and -insecure-tcp, as nodeplugctl takes them. Its
	// certificate needs the operator role (Organization nodeplug:operator
	// or nodeplug:internal): the bench lists, watches, allocates and
	// releases.
	Client app.TLS
	// The services' side, the files they get as --tls-cert-file,
	// --tls-key-file and --tls-client-ca-file (the bench's
	// -tls-server-cert-file, -tls-server-key-file, -tls-client-ca-file).
	ServerCertFile, ServerKeyFile, ClientCAFile string
}

// The flags that name APITCP's files, by field, for messages.
const (
	flagCert       = "-tls-cert-file"
	flagKey        = "-tls-key-file"
	flagCA         = "-tls-ca-file"
	flagServerCert = "-tls-server-cert-file"
	flagServerKey  = "-tls-server-key-file"
	flagClientCA   = "-tls-client-ca-file"
)

// files returns the flags given and the flags missing among the six.
func (t *APITCP) files() (given, missing []string) {
	for _, f := range []struct{ flag, value string }{
		{flagCert, t.Client.CertFile}, {flagKey, t.Client.KeyFile}, {flagCA, t.Client.CAFile},
		{flagServerCert, t.ServerCertFile}, {flagServerKey, t.ServerKeyFile}, {flagClientCA, t.ClientCAFile},
	} {
		if f.value != "" {
			given = append(given, f.flag)
		} else {
			missing = append(missing, f.flag)
		}
	}
	return given, missing
}

// Check says whether the flags make sense together: no certificate files
// (the bench makes its own), all six, or -insecure-tcp alone.
func (t *APITCP) Check() error {
	given, missing := t.files()
	switch {
	case t.Client.Insecure && len(given) > 0:
		return fmt.Errorf("-insecure-tcp takes no certificate files (given: %s)", strings.Join(given, ", "))
	case len(given) > 0 && len(missing) > 0:
		return fmt.Errorf("with certificates of your own, the bench needs its client side (%s, %s, %s) "+
			"and the services' side (%s, %s, %s); missing: %s (give none of them to let the bench make throwaway ones)",
			flagCert, flagKey, flagCA, flagServerCert, flagServerKey, flagClientCA, strings.Join(missing, ", "))
	}
	return nil
}

// generated reports whether the bench makes its own certificates.
func (t *APITCP) generated() bool {
	given, _ := t.files()
	return !t.Client.Insecure && len(given) == 0
}

// transport describes the API transport for the results.
func (t *APITCP) transport() string {
	switch {
	case t == nil:
		return "unix"
	case t.Client.Insecure:
		return "tcp"
	default:
		return "tcp+mtls"
	}
}

// benchClientOrgs is the Organization of the bench's generated client
// certificate: the operator role, the least that allows every call the
// bench makes (List* and Watch* need reader, Allocate and Release operator).
var benchClientOrgs = []string{access.OrgPrefix + access.RoleOperator.String()}

// setup returns the services' extra arguments and the client side to dial
// them with. Without certificate files it first writes a throwaway CA, a
// server certificate for loopback and a client certificate with the
// operator role into <root>/bench-tls/.
func (t *APITCP) setup(root string) (args []string, client *app.TLS, err error) {
	if err := t.Check(); err != nil {
		return nil, nil, err
	}
	args = []string{"--listen-tcp", "127.0.0.1:0"}
	if t.Client.Insecure {
		return append(args, "--insecure-tcp"), &app.TLS{Insecure: true}, nil
	}
	if !t.generated() {
		c := t.Client
		return append(args, "--tls-cert-file", t.ServerCertFile, "--tls-key-file", t.ServerKeyFile, "--tls-client-ca-file", t.ClientCAFile), &c, nil
	}
	f, err := certs.Generate(filepath.Join(root, "bench-tls"), "nodeplug-bench", benchClientOrgs)
	if err != nil {
		return nil, nil, fmt.Errorf("generate certificates: %w", err)
	}
	return append(args, "--tls-cert-file", f.ServerCert, "--tls-key-file", f.ServerKey, "--tls-client-ca-file", f.CA),
		&app.TLS{CertFile: f.ClientCert, KeyFile: f.ClientKey, CAFile: f.CA}, nil
}
