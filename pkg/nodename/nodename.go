// Package nodename decides the name of the one Node a nodeplug process
// serves, the same way in every process that needs it (nodeplug-apiserver
// and the devicemanager must agree).
package nodename

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Resolve is the --node-name flag's value or, when it is empty, the host
// name in lower case; either must be a valid Node name (a DNS-1123
// subdomain). Errors name the flag.
func Resolve(flag string) (string, error) {
	name := flag
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("--node-name not set and the host name is unknown: %w", err)
		}
		name = strings.ToLower(h)
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return "", fmt.Errorf("--node-name %q is not a valid Node name: %s", name, strings.Join(msgs, "; "))
	}
	return name, nil
}
