package kubeaccess

import (
	"context"
	"fmt"
	"strings"
	"sync"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Identity is who the API takes the dramanager to be: the user name and
// groups a SelfSubjectReview answered, or, until one has (or when none
// can), why that is not known. Errors and logs name it; a 403 names the
// user itself, a 401 or a 422 does not. Safe for concurrent use; a nil
// *Identity is one not known.
type Identity struct {
	mu     sync.Mutex
	user   string
	groups []string
	why    string // why user is not known
}

// unknownIdentity is an identity not known, for why.
func unknownIdentity(why string) *Identity { return &Identity{why: why} }

// KnownIdentity is the identity of user in groups (tests, and a caller
// that learnt it otherwise).
func KnownIdentity(user string, groups ...string) *Identity {
	return &Identity{user: user, groups: groups}
}

// User returns the user name and groups; ok is false while they are not
// known.
func (id *Identity) User() (user string, groups []string, ok bool) {
	if id == nil {
		return "", nil, false
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.user, id.groups, id.user != ""
}

// String names the identity: `user "name" (groups a, b)`, or `an
// identity not known (why)`.
func (id *Identity) String() string {
	if id == nil {
		return "an identity not known"
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.user == "" {
		return "an identity not known (" + id.why + ")"
	}
	if len(id.groups) == 0 {
		return fmt.Sprintf("user %q", id.user)
	}
	return fmt.Sprintf("user %q (groups %s)", id.user, strings.Join(id.groups, ", "))
}

func (id *Identity) set(user string, groups []string) {
	id.mu.Lock()
	defer id.mu.Unlock()
	id.user, id.groups, id.why = user, groups, ""
}

func (id *Identity) unknown(why string) {
	id.mu.Lock()
	defer id.mu.Unlock()
	id.user, id.groups, id.why = "", nil, why
}

// Review asks the API who the client is (a SelfSubjectReview,
// authentication.k8s.io/v1, which every authenticated user may create)
// and returns the user name and groups it answered.
func Review(ctx context.Context, client kubernetes.Interface) (user string, groups []string, err error) {
	r, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("SelfSubjectReview: %w", err)
	}
	u := r.Status.UserInfo
	if u.Username == "" {
		return "", nil, fmt.Errorf("SelfSubjectReview: the API answered no user name")
	}
	return u.Username, u.Groups, nil
}
