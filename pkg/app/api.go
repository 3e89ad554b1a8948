package app

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os/user"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nodeplug/nodeplug/pkg/access"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// errListenGone is what --listen and NODEPLUG_<SVC>_LISTEN now answer.
var errListenGone = errors.New("--listen is gone: the API is served on a Unix socket, --api-socket " +
	"(default <root-dir>/nodeplug/<service>.sock); TCP is --listen-tcp with mutual TLS " +
	"(--tls-cert-file, --tls-key-file, --tls-client-ca-file). See docs/upgrading.md")

// goneFlag is a removed flag: setting it, or its variable, is an error.
type goneFlag struct{ err error }

// GoneFlag is a removed flag for fs.Var: setting it, or its environment
// variable, fails with err (which says what replaced it).
func GoneFlag(err error) flag.Value { return goneFlag{err} }

func (g goneFlag) String() string   { return "" }
func (g goneFlag) Set(string) error { return g.err }

// TLS holds the files of mutual TLS, for serving on TCP and for dialling
// TCP peers.
type TLS struct {
	CertFile     string // --tls-cert-file: this side's certificate
	KeyFile      string // --tls-key-file: its key
	ClientCAFile string // --tls-client-ca-file: CA that signs clients (servers)
	CAFile       string // --tls-ca-file: CA that signs servers (clients)
	// Insecure (--insecure-tcp) serves and dials TCP without TLS: for tests
	// only, and only on loopback.
	Insecure bool
}

// AddClientTLS defines the client flags for TCP addresses on f:
// --tls-cert-file, --tls-key-file, --tls-ca-file and --insecure-tcp.
func (f *Flags) AddClientTLS() *TLS { return AddClientTLSFlags(f.FlagSet) }

// AddClientTLSFlags defines the client flags of AddClientTLS on a plain
// flag set (nodeplug-bench's, which has no environment fallback).
func AddClientTLSFlags(f *flag.FlagSet) *TLS {
	t := &TLS{}
	f.StringVar(&t.CertFile, "tls-cert-file", "", "client certificate for TCP addresses (mutual TLS)")
	f.StringVar(&t.KeyFile, "tls-key-file", "", "key of --tls-cert-file")
	f.StringVar(&t.CAFile, "tls-ca-file", "", "CA certificate that signs the services' certificates, for TCP addresses")
	f.BoolVar(&t.Insecure, "insecure-tcp", false, "dial TCP addresses without TLS (tests only, loopback only)")
	return t
}

// Dial returns a connection to a nodeplug service at addr: a Unix socket
// path, or a host:port reached over mutual TLS (plain only with Insecure,
// and only on loopback).
func (t *TLS) Dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if rpcutil.IsUnixPath(addr) {
		return rpcutil.DialPeer(addr, opts...)
	}
	if t.Insecure {
		if !isLoopback(addr) {
			return nil, fmt.Errorf("--insecure-tcp dials only loopback addresses, not %s", addr)
		}
		return rpcutil.DialPeer(addr, opts...)
	}
	cfg, err := access.ClientTLS(t.CertFile, t.KeyFile, t.CAFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	return rpcutil.DialPeer(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}, opts...)...)
}

// serverTLS returns the server side of mutual TLS for --listen-tcp.
func (t *TLS) serverTLS() (*access.ServerTLS, error) {
	return access.NewServerTLS(t.CertFile, t.KeyFile, t.ClientCAFile)
}

// isLoopback reports whether the host of addr is a loopback address.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// lookupGroup returns the GID of a group given by name or number (images
// have no /etc/group, so numbers always work). Empty means none (-1).
func lookupGroup(flagName, g string) (int, error) {
	if g == "" {
		return -1, nil
	}
	if n, err := strconv.Atoi(g); err == nil && n >= 0 {
		return n, nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return -1, fmt.Errorf("--%s %q: not a GID, and no such group: %w", flagName, g, err)
	}
	n, err := strconv.Atoi(grp.Gid)
	if err != nil {
		return -1, fmt.Errorf("--%s %q: group has GID %q", flagName, g, grp.Gid)
	}
	return n, nil
}

// listenAPI creates the API socket, 0660 of group gid (-1: the process's
// own group), in its directory as apiDir makes it ready.
func listenAPI(root, path string, gid int, log *slog.Logger) (net.Listener, error) {
	if err := apiDir(root, path, gid, log); err != nil {
		return nil, err
	}
	return unixsock.ListenMode(path, 0o660, gid)
}
