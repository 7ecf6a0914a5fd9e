package clientcertificate

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	identityv1alpha1 "github.com/knotless-dev/knotless/apis/identity/v1alpha1"
)

// minValid is the least time a certificate is used before it is renewed:
// a renewBefore closer to the duration than this is refused, so a new
// certificate is never due as soon as it is issued.
const minValid = 30 * time.Second

// wanted is a spec checked and with its defaults.
type wanted struct {
	identityv1alpha1.ClusterClientCertificateSpec
	duration, renewBefore time.Duration
}

// check checks spec and fills its defaults; the error says which field is
// wrong and why (a ReasonInvalidSpec message).
func check(spec identityv1alpha1.ClusterClientCertificateSpec) (wanted, error) {
	w := wanted{ClusterClientCertificateSpec: spec, duration: identityv1alpha1.DefaultDuration * time.Second}
	if spec.Duration != nil {
		w.duration = spec.Duration.Duration
	}
	if lo, hi := identityv1alpha1.MinDuration*time.Second, identityv1alpha1.MaxDuration*time.Second; w.duration < lo || w.duration > hi {
		return w, fmt.Errorf("spec.duration %s is out of range: at least %s (the shortest a Kubernetes signer issues), at most %s (a certificate cannot be revoked)", w.duration, lo, hi)
	}
	w.renewBefore = w.duration / 3
	if spec.RenewBefore != nil {
		w.renewBefore = spec.RenewBefore.Duration
	}
	if w.renewBefore <= 0 || w.renewBefore > w.duration-minValid {
		return w, fmt.Errorf("spec.renewBefore %s must be more than 0 and at least %s less than spec.duration %s", w.renewBefore, minValid, w.duration)
	}
	if err := checkName("spec.user", spec.User); err != nil {
		return w, err
	}
	if strings.Contains(spec.User, "#") {
		// A DID has no '#': names with one are the service users of
		// knotless (the mount's user is <did>#mount).
		return w, fmt.Errorf("spec.user %q must not hold '#'", spec.User)
	}
	seen := map[string]bool{}
	for _, g := range spec.Groups {
		if err := checkName("spec.groups", g); err != nil {
			return w, err
		}
		if seen[g] {
			return w, fmt.Errorf("spec.groups names %q twice", g)
		}
		seen[g] = true
	}
	if spec.ClusterRole != "" {
		if err := checkName("spec.clusterRole", spec.ClusterRole); err != nil {
			return w, err
		}
		if strings.ContainsAny(spec.ClusterRole, "/%") || spec.ClusterRole == "." || spec.ClusterRole == ".." {
			return w, fmt.Errorf("spec.clusterRole %q is not a ClusterRole name", spec.ClusterRole)
		}
	}
	if errs := validation.IsDNS1123Subdomain(spec.SecretName); len(errs) > 0 {
		return w, fmt.Errorf("spec.secretName %q is not a Secret name: %s", spec.SecretName, strings.Join(errs, "; "))
	}
	return w, nil
}

// reserved returns the prefixes of user and group names knotless does not
// issue: the system's (system:masters is above RBAC; nodes and
// controllers are system:...), kubeadm's (kubeadm:cluster-admins is
// bound to cluster-admin on a kubeadm cluster such as a kind tenant) and
// knotless's own (the process tenant's mount user, knotless:... roles).
// A certificate for one of them would carry rights that deleting the
// certificate does not take back.
func reserved() []string { return []string{"system:", "kubeadm", "knotless"} }

// checkName refuses an empty name, a reserved one, and one with control
// characters.
func checkName(field, name string) error {
	switch {
	case strings.TrimSpace(name) == "" || len(name) > 253:
		return fmt.Errorf("%s %q must be 1 to 253 characters", field, name)
	case name != strings.TrimSpace(name):
		return fmt.Errorf("%s %q starts or ends with a space", field, name)
	case slices.ContainsFunc(reserved(), func(p string) bool { return strings.HasPrefix(name, p) }):
		return fmt.Errorf("%s %q is reserved (names starting with %s are the system's, kubeadm's or knotless's own)", field, name, strings.Join(reserved(), ", "))
	case strings.IndexFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return fmt.Errorf("%s %q holds a control character", field, name)
	}
	return nil
}
