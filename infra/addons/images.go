package addons

// The component's images: the operator's (images.*) where set, else the defaults, which all name tags (mutable:
// whoever controls the tag controls what runs with the component's identities). A digest in the config pins one.

// autoscalerImage is the Cluster Autoscaler's image: images.autoscaler, else registry.k8s.io's tag of the resolved
// version.
func (a *ClusterAddonsArgs) autoscalerImage() string {
	if a.Images.Autoscaler != "" {
		return a.Images.Autoscaler
	}
	return "registry.k8s.io/autoscaling/cluster-autoscaler:v" + a.AutoscalerVersion.String()
}

// scriptImage is the stock image the controller's init container fetches the controller in and the controller runs
// in: images.scripts, else defaultScriptImage.
func (a *ClusterAddonsArgs) scriptImage() string {
	if a.Images.Scripts != "" {
		return a.Images.Scripts
	}
	return defaultScriptImage
}

// terminationHandlerImage is aws-node-termination-handler's image: images.terminationHandler, else defaultNTHImage.
func (a *ClusterAddonsArgs) terminationHandlerImage() string {
	if a.Images.TerminationHandler != "" {
		return a.Images.TerminationHandler
	}
	return defaultNTHImage
}
