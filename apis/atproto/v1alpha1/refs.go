package v1alpha1

// ObjectKeyRef names one key of a ConfigMap or Secret in the same
// workspace and namespace as the referring object.
type ObjectKeyRef struct {
	// Kind is ConfigMap or Secret.
	// +kubebuilder:validation:Enum=ConfigMap;Secret
	Kind string `json:"kind"`
	// Name of the object.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Key in the object's data.
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
}

// SecretKeyRef names one key of a Secret in the same workspace and
// namespace as the referring object.
type SecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Key in the Secret's data.
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
}

// VaultKeyRef names one key of a KV v2 secret in Vault or OpenBao, read
// through the provider's Vault connection. Path must lie under the prefix
// the provider derives from the workspace: <prefix>/<logical cluster>/...
type VaultKeyRef struct {
	// Mount of the KV v2 engine, for example "secret".
	// +kubebuilder:validation:MinLength=1
	Mount string `json:"mount"`
	// Path of the secret below the mount (without "data/").
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`
	// Key in the secret's data.
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
}

// LocalObjectRef names an object of a known kind in the same namespace.
type LocalObjectRef struct {
	// Name of the object.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}
